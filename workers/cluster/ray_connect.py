"""Connecting to an external Ray cluster, with Ray's token authentication.

Source: Ray's token authentication guide
(https://docs.ray.io/en/latest/ray-security/token-auth.html) and
``ray._private.authentication``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from workers.errors import WorkerError

TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
MODE_ENV = "RAY_AUTH_MODE"
PROBE_TIMEOUT_S = 10.0
HOW_TO_GIVE = (
    f"set {TOKEN_ENV} to the cluster's token (or {TOKEN_PATH_ENV} to a file holding it; "
    "`ray get-auth-token` on the head node prints it)"
)


class RayAuthError(WorkerError):
    """The Ray cluster wants a token this process does not have, or refuses the one it has."""


def token_source(env: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """Where Ray would read its token from, in Ray's own order, or None when nowhere.

    >>> token_source({"RAY_AUTH_TOKEN": "x"}, Path("/nonexistent"))
    'RAY_AUTH_TOKEN'
    >>> token_source({}, Path("/nonexistent")) is None
    True
    """
    env = os.environ if env is None else env
    if env.get(TOKEN_ENV, "").strip():
        return TOKEN_ENV
    if env.get(TOKEN_PATH_ENV):
        return f"{TOKEN_PATH_ENV} ({env[TOKEN_PATH_ENV]})"
    default = (home if home is not None else Path.home()) / ".ray" / "auth_token"
    if default.is_file() and default.read_text().strip():
        return str(default)
    return None


def _readable(path: str | None) -> bool:
    try:
        return path is not None and bool(Path(path).read_text().strip())
    except OSError:
        return False


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while a probe runs: Ray's C++ GCS client writes its
    own warning line for the refused call, which :class:`RayAuthError` then explains."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _refused(address: str) -> bool:
    """True when the GCS at ``address`` refuses this process's credentials (one RPC)."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        with _quiet_native_stderr():
            client = GcsClient(address=address)
            client.internal_kv_get(b"hetsched-probe", None, timeout=PROBE_TIMEOUT_S)
    except AuthenticationError:
        return True
    except Exception as exc:  # other failures are ray.init's to report, in its own words
        return "InvalidAuthToken" in str(exc) or "Unauthenticated" in str(exc)
    return False


def _enable_token_mode() -> None:
    """Turn Ray's token mode on in this process, as ``ray start`` does for itself."""
    from ray._private.authentication.authentication_token_setup import _enable_token_auth
    from ray._raylet import AuthenticationTokenLoader

    _enable_token_auth()
    AuthenticationTokenLoader.instance().reset_cache()


def gcs_address(address: str) -> str | None:
    """``host:port`` of the GCS that ``address`` (``auto`` included) names; None for a
    Ray Client address (``ray://``) or one Ray cannot resolve (``ray.init`` says why)."""
    if "://" in address:
        return None
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address)
    except Exception:  # Ray raises several types; ray.init reports the address itself
        return None


def check_auth(address: str) -> None:
    """Make this process able to talk to the Ray cluster at ``address``, or raise
    :class:`RayAuthError` with one line saying what is missing.

    Ray 2.60 starts ``ray start --head`` with token authentication on, and a driver that
    connects to an explicit address speaks it only when ``RAY_AUTH_MODE=token`` is set
    in its own environment. Without it Ray's GCS client retries for ever, logging
    ``InvalidAuthToken`` every second and never saying what to do. So before
    ``ray.init`` the service asks the cluster's GCS once (a single RPC that fails at
    once on a refused token): when the cluster wants a token and one is available where
    Ray looks for it (``RAY_AUTH_TOKEN``, the file named by ``RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``), this process turns token mode on and checks again; when none
    is there, or the cluster refuses it, the answer is one line saying what is missing
    and how to give it (:class:`RayAuthError`).
    """
    gcs = gcs_address(address)
    if gcs is None or not _refused(gcs):
        return
    source = token_source()
    if source is None:
        raise RayAuthError(
            f"ray-address: the Ray cluster at {address} requires token authentication "
            f"and no token was found; {HOW_TO_GIVE}"
        )
    path = os.environ.get(TOKEN_PATH_ENV)
    if source.startswith(TOKEN_PATH_ENV) and not _readable(path):
        # Ray aborts the whole process on an unreadable token file: say so first.
        raise RayAuthError(
            f"ray-address: {TOKEN_PATH_ENV} names {path}, which cannot be read or is empty; "
            f"{HOW_TO_GIVE}"
        )
    if os.environ.get(MODE_ENV, "").lower() != "token":
        _enable_token_mode()
        if not _refused(gcs):
            return
    raise RayAuthError(
        f"ray-address: the Ray cluster at {address} refused the token from {source} "
        f"(not this cluster's token); {HOW_TO_GIVE}"
    )


def connect(address: str) -> None:
    """``ray.init`` against ``address`` after :func:`check_auth` (no-op when connected)."""
    import ray

    if ray.is_initialized():
        return
    check_auth(address)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise WorkerError(f"ray-address: cannot connect to {address}: {exc}") from exc
