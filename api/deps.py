"""Dependencies as ``Annotated`` aliases, in the manner of full-stack-fastapi-template.

Everything a route needs comes from the :class:`AppState` the lifespan put on
``app.state``; nothing is a module-level singleton. The dependencies
that do not block are ``async`` (a sync one costs a thread-pool hop); ``get_job``
reads the database, so it is sync: on the event loop, its read waited behind
the executor's step writes and held up every other request (p99 222 ms at 50
pollers of ``GET /jobs/{id}``). For the same reason :func:`get_principal` looks a
user's token up in a worker thread; the admin token and single-user mode need no read.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.accounts import SINGLE_USER, Principal, UserRecord, may, refusal
from api.core.settings import Settings
from api.execution.executor import Executor
from api.schemas.service import ErrorPublic
from api.services import ClusterHandle, Profiler
from api.store import JobRecord, JobStore

JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(kw_only=True, slots=True)
class AppState:
    settings: Settings
    store: JobStore
    handle: ClusterHandle
    profiler: Profiler
    executor: Executor | None


async def get_state(request: Request) -> AppState:
    return request.app.state.hetsched  # type: ignore[no-any-return]


StateDep = Annotated[AppState, Depends(get_state)]


async def get_store(state: StateDep) -> JobStore:
    return state.store


StoreDep = Annotated[JobStore, Depends(get_store)]

_bearer = HTTPBearer(
    auto_error=False,
    description="Needed once HETSCHED_API_TOKEN or any user's token is configured.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"}
    )


def _user_principal(user: UserRecord | None, *, where: str) -> Principal:
    refused = refusal(user, where=where)
    if refused is not None:
        raise _unauthorized(refused)
    assert user is not None
    return user.principal


def single_user(state: AppState) -> bool:
    """No token is configured anywhere: the service is single-user (loopback only)."""
    return state.settings.token is None and not state.store.accounts.has_tokens()


def principal_without_lookup(
    state: AppState, authorization: str | None, identity: str | None
) -> Principal | None:
    """Who a request acts as, where that needs no read of the users' table: everyone in
    single-user mode, the admin's token, a user's token found unchanged since it was
    last looked up, or nobody (no token, no identity header). None: a user's token or
    name that :func:`get_principal` looks up (and refuses, if it must)."""
    settings = state.settings
    if single_user(state):
        return SINGLE_USER
    if authorization is not None:
        scheme, _, given = authorization.partition(" ")
        given, admin_token = given.strip(), settings.token
        if scheme.lower() != "bearer" or not given:
            return None
        if admin_token is not None and secrets.compare_digest(given.encode(), admin_token.encode()):
            return SINGLE_USER
        user = state.store.accounts.known_token(given)
        return user.principal if user is not None and refusal(user, where="token") is None else None
    if settings.identity_header and identity:
        return None
    return Principal(name=None, reads_all=settings.open_reads)


async def get_principal(state: StateDep, request: Request, credentials: Credentials) -> Principal:
    """Who the request acts as. With no token configured anywhere, everyone is the single
    (admin) user, as before users existed; then a bearer token (``HETSCHED_API_TOKEN``: the
    admin; otherwise a user's), the trusted proxy's header, or nobody."""
    settings, accounts = state.settings, state.store.accounts
    header = settings.identity_header
    identity = request.headers.get(header) if header else None
    known = principal_without_lookup(state, request.headers.get("authorization"), identity)
    if known is not None:
        return known
    if credentials is not None:
        user = await run_in_threadpool(accounts.by_token, credentials.credentials)
        return _user_principal(user, where="token")
    if header and identity:
        user = await run_in_threadpool(accounts.user, identity)
        return _user_principal(user, where=f"user {identity[:64]!r} in {header}")
    return Principal(name=None, reads_all=settings.open_reads)  # an Authorization not Bearer


PrincipalDep = Annotated[Principal, Depends(get_principal)]

NO_TOKEN = "authorization: send 'Authorization: Bearer <token>'"


async def require_reader(principal: PrincipalDep) -> Principal:
    """Reads of jobs, logs, metrics, checkpoints and the schedule need a token once tokens
    exist, unless ``HETSCHED_OPEN_READS`` opens them."""
    if not principal.authenticated and not principal.reads_all:
        raise _unauthorized(NO_TOKEN)
    return principal


async def require_token(principal: PrincipalDep) -> Principal:
    """Mutating calls need a token once one is configured."""
    if not principal.authenticated:
        raise _unauthorized(NO_TOKEN)
    return principal


async def require_admin(principal: Annotated[Principal, Depends(require_token)]) -> Principal:
    """Users, projects, the audit log, profiling and fault injection: admins only."""
    if not principal.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "authorization: admins only")
    return principal


Auth = Depends(require_token)
ReadAuth = Depends(require_reader)
AdminAuth = Depends(require_admin)
ReaderDep = Annotated[Principal, ReadAuth]
ActorDep = Annotated[Principal, Auth]
AdminDep = Annotated[Principal, AdminAuth]
Responses = dict[int | str, dict[str, Any]]
"""A route's documented ``responses=``."""


def errors(descriptions: Mapping[int, str]) -> Responses:
    """The documented error answers of a route: each status an :class:`ErrorPublic`,
    described as given."""
    return {code: {"model": ErrorPublic, "description": why} for code, why in descriptions.items()}


UNAUTHORIZED = errors({401: "Token missing or wrong"})
"""What a route that depends on ``Auth`` adds to its documented ``responses``."""
ADMIN_ONLY = {**UNAUTHORIZED, **errors({403: "Not an admin's token"})}


def get_job(job_id: str, store: StoreDep, principal: ReaderDep) -> JobRecord:
    """The job, if ``principal`` may read it: another project's job is as absent as one
    that never existed (404), so ids do not leak."""
    job = store.get(job_id) if JOB_ID.fullmatch(job_id) else None
    if job is None or not may(principal, job.project, "read"):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job: no job with id {job_id!r}")
    return job


JobDep = Annotated[JobRecord, Depends(get_job)]


async def get_job_to_act(job: JobDep, principal: ActorDep) -> JobRecord:
    """The job, if ``principal`` may also stop or delete it (404 as for one it cannot see)."""
    if not may(principal, job.project, "act"):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job: no job with id {job.id!r}")
    return job


ActJobDep = Annotated[JobRecord, Depends(get_job_to_act)]


def check_project(principal: Principal, name: str, *, known: bool) -> None:
    """Refuse (409) a job or upload into a project that does not exist or that the
    caller is not a member of; one message for both, so names do not leak."""
    if principal.is_admin and not known:
        raise HTTPException(status.HTTP_409_CONFLICT, f"project: no project {name!r}")
    if not principal.is_admin and (name not in principal.projects or not known):
        yours = ", ".join(principal.projects) or "none"
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"project: {name!r} is not one of yours ({yours})"
        )
