"""Make the HTTP contract say what the service does: the OpenAPI document and ``Allow``.

- Errors: the 422 schema is the one-line ``{"detail": "<field>: ..."}`` the
  handlers send, not FastAPI's list of pydantic errors.
- Authorization: mutating calls need ``Authorization: Bearer <token>`` only
  when ``HETSCHED_API_TOKEN`` is set, so only then does the document declare
  the bearer scheme and mark those operations secured; without a token the
  service accepts the calls unauthenticated and the document says so.
- ``Allow``: Starlette answers a wrong method with the methods of the first
  route whose path matched, so ``/jobs/{id}`` said ``Allow: GET`` although
  DELETE exists. :class:`AllowHeader` lists every method the document has
  for the path, on 405 answers and on ``OPTIONS`` (204, RFC 9110 §9.3.7).
- A body that is not JSON at all (not UTF-8) gets FastAPI's 400; it is
  documented on every operation that takes a body.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ERROR_SCHEMA = {
    "title": "HTTPValidationError",
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {
            "type": "string",
            "title": "Detail",
            "description": "One line per bad field: '<field>: <what is allowed>', joined by '; '.",
        }
    },
}


def _drop_security(schema: dict[str, Any]) -> None:
    """Without a token no operation needs credentials: remove every trace of the scheme."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.pop("security", None)
                responses = operation.get("responses", {})
                responses.pop("401", None)
    schema.get("components", {}).pop("securitySchemes", None)


def _document_unparseable_body(schema: dict[str, Any]) -> None:
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                operation.setdefault("responses", {}).setdefault(
                    "400",
                    {
                        "description": "The body could not be read (not UTF-8 JSON)",
                        "content": {"application/json": {"schema": ERROR_SCHEMA}},
                    },
                )


def _limit_device_counts(schema: dict[str, Any], num_devices: int) -> None:
    """A job's ``min_devices`` and ``max_devices`` cannot exceed this cluster's devices."""
    job = schema.get("components", {}).get("schemas", {}).get("JobCreate", {})
    for name in ("min_devices", "max_devices"):
        field = job.get("properties", {}).get(name, {})
        for branch in [field, *field.get("anyOf", [])]:
            if branch.get("type") == "integer":
                branch["maximum"] = num_devices


def install_openapi(
    app: FastAPI, *, token_required: bool, num_devices: Callable[[], int] | None = None
) -> None:
    """Replace ``app.openapi`` with a document true to this configuration.

    ``num_devices``: the cluster's device count once the service runs (0: unknown),
    the most devices a job may ask for.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            components = schema.get("components", {}).get("schemas", {})
            components.pop("ValidationError", None)
            if "HTTPValidationError" in components:
                components["HTTPValidationError"] = ERROR_SCHEMA
            _document_unparseable_body(schema)
            if not token_required:
                _drop_security(schema)
            count = num_devices() if num_devices is not None else 0
            if count:
                _limit_device_counts(schema, count)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


def _template(path: str) -> re.Pattern[str]:
    """``/api/v1/jobs/{job_id}`` -> a pattern matching ``/api/v1/jobs/<one segment>``."""
    segments = [
        "[^/]+" if part.startswith("{") and part.endswith("}") else re.escape(part)
        for part in path.split("/")
    ]
    return re.compile("/".join(segments))


def documented_methods(schema: dict[str, Any]) -> list[tuple[re.Pattern[str], set[str]]]:
    """Each documented path as a pattern, with its methods (HEAD wherever GET is)."""
    found = []
    for path, operations in schema.get("paths", {}).items():
        methods = {m.upper() for m in operations if m in HTTP_METHODS}
        if "GET" in methods:
            methods.add("HEAD")
        found.append((_template(path), methods))
    return found


def allowed_methods(paths: list[tuple[re.Pattern[str], set[str]]], path: str) -> set[str]:
    """Every method some documented operation serves at ``path``."""
    methods: set[str] = set()
    for pattern, served in paths:
        if pattern.fullmatch(path):
            methods |= served
    return methods


def _allow(methods: set[str]) -> bytes:
    return ", ".join(sorted(methods | {"OPTIONS"})).encode()


class AllowHeader:
    """ASGI middleware: ``OPTIONS`` and 405 answers carry the path's full ``Allow`` set,
    taken from the OpenAPI document (so the two cannot disagree)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._paths: list[tuple[re.Pattern[str], set[str]]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._paths is None:
            self._paths = documented_methods(scope["app"].openapi())
        paths, path = self._paths, scope["path"]
        if scope["method"] == "OPTIONS":
            methods = allowed_methods(paths, path)
            if methods:
                headers = [(b"allow", _allow(methods)), (b"content-length", b"0")]
                await send({"type": "http.response.start", "status": 204, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
                return

        async def send_with_allow(message: Message) -> None:
            methods = set()
            if message["type"] == "http.response.start" and message["status"] == 405:
                methods = allowed_methods(paths, path)  # empty: an undocumented page's own
            if methods:
                kept = [(k, v) for k, v in message["headers"] if k.lower() != b"allow"]
                message = {**message, "headers": [*kept, (b"allow", _allow(methods))]}
            await send(message)

        await self.app(scope, receive, send_with_allow)
