"""What every request passes before the app sees it: one pure ASGI middleware.

In order, each refusal one line ``{"detail": "<field>: <what is allowed>"}``:

1. ``Host`` must be a name this service answers to (400): the bound address,
   loopback names, and ``HETSCHED_ALLOWED_HOSTS``. A page on ``evil.example``
   whose name is re-bound to 127.0.0.1 (DNS rebinding) sends
   ``Host: evil.example`` and is refused.
2. A mutating call (POST, PUT, PATCH, DELETE) carrying a foreign ``Origin``
   is refused (403). Browsers send ``Origin`` on every cross-origin POST, even
   the "simple" ``text/plain`` ones that need no CORS preflight, so this is
   what stops a web page from stopping jobs; clients such as ``curl`` send no
   ``Origin`` and the dashboard sends its own.
3. With a token configured (the admin's, or any user's), a mutating call's
   ``Authorization`` is checked before one byte of its body is read (401): an
   anonymous 300 MB body costs the service nothing. A user's token is looked up
   in a worker thread (:class:`UserTokens`); a trusted proxy's identity header
   stands in for a token, and the routes then check the user it names.
4. A body where the API takes JSON must say ``application/json`` (415) and be
   at most ``HETSCHED_MAX_JSON_BYTES`` (413, refused before it is read when
   ``Content-Length`` says so, else as soon as the count passes the limit).
   Dataset uploads are streamed by their route under their own limit.

The checks follow OWASP's CSRF and DNS-rebinding advice (verify ``Origin``
against the target origin; validate ``Host``):
https://cheatsheetseries.owasp.org/cheatsheets/Cross-Site_Request_Forgery_Prevention_Cheat_Sheet.html
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})


class Refused(Exception):
    """A request turned away before the app: its status, one-line detail and headers."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def hostname(host_header: str) -> str:
    """The name part of a ``Host`` value, lower-case, without port or IPv6 brackets.

    >>> [hostname(h) for h in ("Example.COM:8000", "[::1]:80", "127.0.0.1")]
    ['example.com', '::1', '127.0.0.1']
    """
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class HostPolicy:
    """Which ``Host`` names are served: loopback names, the bound address, the extra names
    (``*`` any, ``.example.com`` it and its subdomains), and, when bound to every
    interface, any IP literal and this machine's host name (an IP literal cannot be
    re-bound; a name an attacker controls can)."""

    bound: str
    extra: tuple[str, ...] = ()

    def names(self) -> list[str]:
        shown = sorted(LOOPBACK_NAMES | {hostname(self.bound)} - {""})
        if self.bound in WILDCARD_ADDRESSES:
            shown += ["any IP address", socket.gethostname().lower()]
        return shown + list(self.extra)

    def allows(self, name: str) -> bool:
        if name in LOOPBACK_NAMES or name == hostname(self.bound):
            return True
        for allowed in self.extra:
            allowed = allowed.lower()
            if allowed == "*" or name == allowed.lstrip("."):
                return True
            if allowed.startswith(".") and name.endswith(allowed):
                return True
        if self.bound in WILDCARD_ADDRESSES:
            return _is_ip(name) or name == socket.gethostname().lower()
        return False


class UserTokens(Protocol):
    """The users' tokens, as the guard asks about them (api/app.py answers from the store)."""

    def exist(self) -> bool:
        """Whether any user holds a live token (then mutating calls need one); cheap."""
        ...

    def refusal(self, token: str) -> str | None:
        """None when ``token`` is a live user's; else the one-line 401. May block."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class GuardConfig:
    hosts: HostPolicy
    token: str | None
    """Mutating calls need ``Authorization: Bearer <token>`` (this, the admin's, or a
    user's); None and no user tokens: no check."""
    users: UserTokens | None = None
    identity_header: str | None = None
    """A trusted proxy's header naming the user (``HETSCHED_IDENTITY_HEADER``)."""
    max_json_bytes: int
    streamed_paths: frozenset[str]
    """Paths whose POST body is a raw file the route streams itself (dataset uploads)."""


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _host(scope: Scope) -> str:
    """The ``Host`` header's value; empty without one."""
    for key, value in scope["headers"]:
        if key == b"host":  # ASGI servers hand header names over lower-cased
            return value.decode("latin-1")
    return ""


CHALLENGE = {"www-authenticate": "Bearer"}


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer`` value; a :class:`Refused` 401 without one."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Refused(401, "authorization: send 'Authorization: Bearer <token>'", CHALLENGE)
    return credentials.strip()


async def check_any_token(headers: dict[str, str], config: GuardConfig) -> None:
    """The admin's token, a live user's, or the trusted proxy's header; a 401 otherwise."""
    header = (config.identity_header or "").lower()
    if header and headers.get(header) and "authorization" not in headers:
        return  # the routes check the user it names
    given = bearer(headers.get("authorization"))
    if config.token is not None and secrets.compare_digest(given.encode(), config.token.encode()):
        return
    refusal = "authorization: wrong token"
    if config.users is not None:
        refusal = await run_in_threadpool(config.users.refusal, given) or ""
    if refusal:
        raise Refused(401, refusal, CHALLENGE)


def check_origin(origin: str | None, host: str) -> None:
    """A foreign (or opaque ``null``) ``Origin`` on a mutating call is a :class:`Refused` 403."""
    if origin is None:
        return
    if origin != "null" and urlsplit(origin).netloc.lower() == host.strip().lower():
        return
    raise Refused(
        403,
        f"origin: a cross-site request from {origin[:80]!r} may not change anything here; "
        "use the dashboard on this service, or an API client (which sends no Origin)",
    )


def check_body_headers(headers: dict[str, str], limit: int) -> bool:
    """Whether a JSON body comes; its media type and declared size checked (415, 413)."""
    declared = headers.get("content-length", "")
    has_body = "transfer-encoding" in headers or (declared.isdigit() and int(declared) > 0)
    if not has_body:
        return False
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise Refused(
            415,
            f"content-type: {media or 'none'!r} is not accepted; send the body as application/json",
        )
    if declared.isdigit() and int(declared) > limit:
        raise Refused(
            413, f"body: {int(declared):,} bytes exceed the JSON limit of {limit:,} bytes"
        )
    return True


async def read_capped(receive: Receive, limit: int) -> list[Message]:
    """The body's messages, refused (413) once they pass ``limit`` bytes."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages
        size += len(message.get("body", b""))
        if size > limit:
            raise Refused(413, f"body: more than the JSON limit of {limit:,} bytes")
        if not message.get("more_body", False):
            return messages


class RequestGuard:
    """ASGI middleware: the checks of this module, before routing and before the body."""

    def __init__(self, app: ASGIApp, *, config: GuardConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = await self._check(scope, receive)
        except Refused as refused:
            await _answer(send, refused)
            return
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope, receive: Receive) -> Receive:
        config = self.config
        host = _host(scope)
        if not config.hosts.allows(hostname(host)):
            raise Refused(
                400,
                f"host: {host[:80]!r} is not a name this service answers to; allowed: "
                f"{', '.join(config.hosts.names())} (HETSCHED_ALLOWED_HOSTS adds names)",
            )
        if scope["method"] not in MUTATING:
            return receive  # reads (dashboards polling) need the Host alone
        headers = _headers(scope)
        check_origin(headers.get("origin"), host)
        if config.token is not None or (config.users is not None and config.users.exist()):
            await check_any_token(headers, config)
        if scope["path"] in config.streamed_paths:
            return receive
        if not check_body_headers(headers, config.max_json_bytes):
            return receive
        pending = await read_capped(receive, config.max_json_bytes)

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

        return replay


async def _answer(send: Send, refused: Refused) -> None:
    body = json.dumps({"detail": refused.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in refused.headers.items()),
    ]
    if refused.status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is never read
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
