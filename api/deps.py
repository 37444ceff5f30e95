"""Dependencies as ``Annotated`` aliases, in the manner of full-stack-fastapi-template.

Everything a route needs comes from the :class:`AppState` the lifespan put on
``app.state``; nothing is a module-level singleton. The dependencies
that do not block are ``async`` (a sync one costs a thread-pool hop); ``get_job``
reads the database, so it is sync: on the event loop, its read waited behind
the executor's step writes and held up every other request (p99 222 ms at 50
pollers of ``GET /jobs/{id}``).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

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

_bearer = HTTPBearer(auto_error=False, description="Needed when HETSCHED_API_TOKEN is set.")


async def require_token(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Mutating calls need the bearer token when one is configured; reads stay open."""
    token = state.settings.token
    if token is None:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "authorization: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "authorization: wrong token",
            headers={"WWW-Authenticate": "Bearer"},
        )


Auth = Depends(require_token)
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorPublic, "description": "Token missing or wrong"}
}
"""What a route that depends on ``Auth`` adds to its documented ``responses``."""


def get_job(job_id: str, store: StoreDep) -> JobRecord:
    job = store.get(job_id) if JOB_ID.fullmatch(job_id) else None
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job: no job with id {job_id!r}")
    return job


JobDep = Annotated[JobRecord, Depends(get_job)]
