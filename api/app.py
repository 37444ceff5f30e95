"""The FastAPI application: ``create_app(settings)`` and its lifespan.

The lifespan builds everything stateful (database engine, job store, Ray
connection, executor) and puts it on ``app.state``; nothing is built at
import, so tests make one app per temporary database. Error handlers turn
every user error into one line, ``{"detail": "<field>: <what is allowed>"}``:
422 for invalid input, 409 for valid input this server cannot serve now (a plan that
cannot fit, a precision its devices lack), never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.accounts import AccountStore, refusal
from api.contract import AllowHeader, install_openapi
from api.core.db import make_engine
from api.core.guards import GuardConfig, HostPolicy, RequestGuard, UserTokens
from api.core.settings import API_PREFIX, Settings
from api.core.telemetry import HttpMetrics, Telemetry
from api.deps import AppState
from api.execution.executor import Executor
from api.routes import api_router, docs, health, metrics
from api.routes.jobs import JobPolls
from api.services import (
    ClusterHandle,
    ClusterUnavailable,
    NotOnServer,
    Profiler,
    connect_cluster,
)
from api.store import JobStore, StoreUnavailable
from api.views import JobPages
from scheduler.errors import HetschedError, PlanError
from scheduler.hardware.precision import PrecisionError

log = logging.getLogger("hetsched.api")


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    # drop pydantic's union-branch tags such as "str" / "ModelDims"
    parts = [
        p
        for p in parts
        if p not in ("str", "ModelDims", "TrainableModelDims") and not p.startswith("function-")
    ]
    return ".".join(parts) or "body"


def _readable(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error.get("type") == "json_invalid":
        return "body: is not valid JSON"
    if error.get("type") == "missing":
        return f"{_field(error['loc'])}: required"
    value = error.get("input")
    shown = ""
    if error.get("type") not in ("extra_forbidden",) and isinstance(value, int | float | str):
        text = repr(value)
        shown = f", got {text[:40]}{'…' if len(text) > 40 else ''}"
    return f"{_field(error['loc'])}: {message}{shown}"


def validation_detail(exc: RequestValidationError) -> str:
    """One line per field, joined by '; '."""
    errors = list(exc.errors())

    # A model given as dimensions also fails the preset-name branch ("should be a valid
    # string"), and a bad name fails the dimensions branch ("should be a valid
    # dictionary"); each time the other branch's complaint is noise.
    not_object = ("model_type", "model_attributes_type")

    def string_branch(error: Any) -> bool:
        last = str(error["loc"][-1]) if error["loc"] else ""
        return last == "str" or last.endswith("str]")  # plain, or a checked str

    def siblings(error: Any) -> list[Any]:
        loc = tuple(error["loc"])
        return [
            o
            for o in errors
            if tuple(o["loc"][: len(loc) - 1]) == loc[:-1] and tuple(o["loc"]) != loc
        ]

    def other_branch_failed(error: Any) -> bool:
        if string_branch(error):  # dropped when the dimensions themselves are wrong
            return any(o["type"] not in not_object for o in siblings(error))
        return error["type"] in not_object and any(  # a string that is wrong as a string
            string_branch(o) and o["type"] != "string_type" for o in siblings(error)
        )

    errors = [e for e in errors if not other_branch_failed(e)]
    lines = list(dict.fromkeys(_readable(e) for e in errors))
    return "; ".join(lines)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": validation_detail(exc)}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT
        )

    @app.exception_handler(HetschedError)
    async def _hetsched(_request: Request, exc: HetschedError) -> JSONResponse:
        code = (
            status.HTTP_409_CONFLICT
            if isinstance(exc, PlanError | ClusterUnavailable | NotOnServer | PrecisionError)
            else status.HTTP_503_SERVICE_UNAVAILABLE
            if isinstance(exc, StoreUnavailable)
            else (status.HTTP_422_UNPROCESSABLE_CONTENT)
        )
        return JSONResponse(
            {"detail": str(exc).splitlines()[0] if str(exc) else "invalid"}, status_code=code
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(
            {"detail": f"internal error: {type(exc).__name__}"},
            status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )


def _keeping_signal_handlers(connect: Callable[[], ClusterHandle]) -> ClusterHandle:
    """``ray.init`` replaces SIGTERM/SIGINT handlers with ``sys.exit``; put uvicorn's back
    so that stopping the server shuts it down gracefully."""
    if threading.current_thread() is not threading.main_thread():
        return connect()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return connect()
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def build_state(
    settings: Settings, cluster: ClusterHandle | None = None, telemetry: Telemetry | None = None
) -> AppState:
    """Everything stateful, over ``cluster`` when the caller owns one already
    (connected per ``settings`` otherwise)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.database_url, busy_timeout_s=settings.db_busy_timeout_s)
    store = JobStore(engine, retry_s=settings.db_retry_s)
    interrupted = store.running()
    if interrupted:
        log.warning(
            "%d job(s) were running when the service stopped; they resume from their "
            "last checkpoint: %s",
            len(interrupted),
            ", ".join(j.id for j in interrupted),
        )
    handle = cluster or _keeping_signal_handlers(lambda: connect_cluster(settings))
    if not handle.available:
        log.warning("cluster unavailable: %s", handle.message)
    profiler = Profiler(store=store, handle=handle, cache_dir=settings.profile_cache_dir)
    executor = None
    if settings.executor:
        executor = Executor(
            store=store, handle=handle, profiler=profiler, settings=settings, telemetry=telemetry
        )
    return AppState(
        settings=settings, store=store, handle=handle, profiler=profiler, executor=executor
    )


def create_app(
    settings: Settings | None = None, *, cluster: ClusterHandle | None = None
) -> FastAPI:
    """The control plane. ``settings`` default to the ``HETSCHED_*`` environment.

    ``cluster``: a connected cluster (Ray and its warm device workers) that outlives
    the app; the app uses it and leaves it open, so several apps in turn (a restart in
    a test, a notebook) share one set of warm workers. Without it the app connects
    per ``settings`` and closes what it connected when it stops.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(settings, cluster, telemetry)
        app.state.hetsched = state
        if state.executor is not None:
            state.executor.start()
        try:
            yield
        finally:
            if state.executor is not None:
                state.executor.shutdown()
            state.store.engine.dispose()
            if cluster is None:
                state.handle.close()

    app = FastAPI(
        title="hetsched",
        summary="Train one transformer across mixed GPUs with uneven per-device batches.",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # FastAPI's pages load from a CDN; api/routes/docs.py serves them offline
        redoc_url=None,
    )
    app.state.metrics_registry = metrics.build_registry(
        lambda: getattr(app.state, "hetsched", None)
    )
    telemetry = app.state.telemetry = Telemetry(app.state.metrics_registry)
    app.state.job_pages = JobPages()
    install_error_handlers(app)
    install_openapi(
        app, token_required=settings.token is not None, num_devices=lambda: _num_devices(app)
    )
    app.add_middleware(AllowHeader)  # innermost: OPTIONS and 405s, never a poll's 200
    app.add_middleware(JobPolls)  # after the guard, before routing
    # Added last, so it runs first: nothing is routed or read before the guard passed it.
    app.add_middleware(RequestGuard, config=guard_config(settings, users=StoredTokens(app)))
    app.add_middleware(HttpMetrics, telemetry=telemetry)  # counts the guard's refusals too
    app.include_router(api_router, prefix=API_PREFIX)
    app.include_router(health.router)
    app.include_router(metrics.router)
    docs.add_docs(app, openapi_url=f"{API_PREFIX}/openapi.json")
    _add_dashboard(app)
    return app


@dataclass(frozen=True, slots=True)
class StoredTokens:
    """The users' tokens in the app's store (:class:`~api.core.guards.UserTokens`), once
    its lifespan has built the store; none before."""

    app: FastAPI

    def _accounts(self) -> AccountStore | None:
        state: AppState | None = getattr(self.app.state, "hetsched", None)
        return state.store.accounts if state is not None else None

    def exist(self) -> bool:
        accounts = self._accounts()
        return accounts is not None and accounts.has_tokens()

    def refusal(self, token: str) -> str | None:
        accounts = self._accounts()
        return refusal(accounts.by_token(token) if accounts else None, where="token")


def guard_config(settings: Settings, *, users: UserTokens | None = None) -> GuardConfig:
    """What :class:`~api.core.guards.RequestGuard` checks, from the settings."""
    return GuardConfig(
        hosts=HostPolicy(bound=settings.host, extra=tuple(settings.allowed_hosts)),
        token=settings.token,
        users=users,
        identity_header=settings.identity_header,
        max_json_bytes=settings.max_json_bytes,
        streamed_paths=frozenset({f"{API_PREFIX}/datasets"}),
    )


def _num_devices(app: FastAPI) -> int:
    """The cluster's device count once the lifespan connected it; 0 before."""
    state = getattr(app.state, "hetsched", None)
    cluster = state.handle.cluster if state is not None else None
    return len(cluster.ids) if cluster is not None else 0


def _add_dashboard(app: FastAPI) -> None:
    """The dashboard at ``/`` (api/routes/dashboard.py), after the API routes."""
    try:
        dashboard = importlib.import_module("api.routes.dashboard")
    except ModuleNotFoundError:
        log.warning("dashboard not installed; serving the API only")
        return
    dashboard.add_dashboard(app)
