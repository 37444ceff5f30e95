"""``/api/v1/users`` and ``/api/v1/projects``: who may use the service, and the quotas
their projects share the cluster under. Admins manage both; anyone sees ``/users/me``.

Users need an admin token first (``HETSCHED_API_TOKEN``): without one the service is
single-user, and the first user's token would lock the loopback user out.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from api.accounts import (
    AccountConflict,
    AccountError,
    ProjectRecord,
    UserRecord,
)
from api.core.db import now
from api.deps import ADMIN_ONLY, UNAUTHORIZED, AdminDep, ReaderDep, StateDep, errors, single_user
from api.schemas.users import (
    Me,
    ProjectCreate,
    ProjectPublic,
    ProjectsPublic,
    ProjectUpdate,
    UserCreate,
    UserCreated,
    UserPublic,
    UsersPublic,
)

users = APIRouter(prefix="/users", tags=["users"])
projects = APIRouter(prefix="/projects", tags=["users"])

CONFLICT = errors({409: "The name exists, or no admin token"})
MISSING = errors({404: "No such user or project"})


def _public(user: UserRecord) -> UserPublic:
    return UserPublic(
        name=user.name,
        is_admin=user.is_admin,
        projects=list(user.projects),
        created_at=user.created_at,
        revoked_at=user.revoked_at,
    )


def _project_public(project: ProjectRecord) -> ProjectPublic:
    return ProjectPublic.model_validate(project, from_attributes=True)


def _conflict(exc: AccountConflict | AccountError) -> HTTPException:
    return HTTPException(status.HTTP_409_CONFLICT, str(exc))


@users.get("/me", response_model=Me, responses=UNAUTHORIZED)
async def read_me(principal: ReaderDep, state: StateDep) -> Me:
    """Who the caller's token says they are (the single user when no token is configured;
    nobody, with ``HETSCHED_OPEN_READS``, when none is sent)."""
    return Me(
        name=principal.name,
        is_admin=principal.is_admin,
        projects=list(principal.projects),
        single_user=single_user(state),
    )


@users.post(
    "",
    response_model=UserCreated,
    status_code=status.HTTP_201_CREATED,
    responses={**ADMIN_ONLY, **CONFLICT},
)
def add_user(spec: UserCreate, state: StateDep, principal: AdminDep) -> UserCreated:
    """A user and their API token, shown this once (only its SHA-256 is kept)."""
    accounts = state.store.accounts
    if single_user(state):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            "users: set HETSCHED_API_TOKEN (the admin's token) and restart before adding "
            "users; without it the service is single-user",
        )
    try:
        user, token = accounts.add_user(spec.name, projects=spec.projects, is_admin=spec.is_admin)
    except (AccountConflict, AccountError) as exc:  # a missing project is server state: 409
        raise _conflict(exc) from exc
    accounts.audit(
        principal,
        "user.add",
        user.name,
        project=None,
        detail=f"projects {', '.join(user.projects) or 'none'}"
        + (", admin" if user.is_admin else ""),
    )
    return UserCreated(**_public(user).model_dump(), token=token)


@users.get("", response_model=UsersPublic, responses=ADMIN_ONLY)
def list_users(state: StateDep, _principal: AdminDep) -> UsersPublic:
    data = [_public(u) for u in state.store.accounts.users()]
    return UsersPublic(data=data, count=len(data))


@users.post(
    "/{name}/revoke", response_model=UserPublic, responses={**ADMIN_ONLY, **MISSING, **CONFLICT}
)
def revoke_user(name: str, state: StateDep, principal: AdminDep) -> UserPublic:
    """The user's token stops working at once; their jobs and datasets stay."""
    accounts = state.store.accounts
    try:
        user = accounts.revoke(name)
    except AccountError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except AccountConflict as exc:
        raise _conflict(exc) from exc
    accounts.audit(principal, "user.revoke", name, project=None)
    return _public(user)


@projects.post(
    "",
    response_model=ProjectPublic,
    status_code=status.HTTP_201_CREATED,
    responses={**ADMIN_ONLY, **CONFLICT},
)
def add_project(spec: ProjectCreate, state: StateDep, principal: AdminDep) -> ProjectPublic:
    """A project with its quotas (each limit left out: none)."""
    accounts = state.store.accounts
    record = ProjectRecord(**spec.model_dump(), created_at=now())
    try:
        accounts.add_project(record)
    except AccountConflict as exc:
        raise _conflict(exc) from exc
    accounts.audit(principal, "project.add", spec.name, project=spec.name, detail=_quotas(record))
    return _project_public(record)


@projects.patch("/{name}", response_model=ProjectPublic, responses={**ADMIN_ONLY, **MISSING})
def update_project(
    name: str, spec: ProjectUpdate, state: StateDep, principal: AdminDep
) -> ProjectPublic:
    """Change the quotas given (``null`` lifts one); the next scheduling round applies them."""
    accounts = state.store.accounts
    changes = spec.model_dump(exclude_unset=True)
    try:
        record = accounts.set_quotas(name, **changes)
    except AccountError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    accounts.audit(principal, "project.update", name, project=name, detail=_quotas(record))
    if state.executor is not None:
        state.executor.wake()
    return _project_public(record)


@projects.get("", response_model=ProjectsPublic, responses=UNAUTHORIZED)
def list_projects(state: StateDep, principal: ReaderDep) -> ProjectsPublic:
    """Every project for an admin; the caller's own otherwise."""
    every = state.store.accounts.projects()
    data = [_project_public(p) for p in every if principal.is_admin or p.name in principal.projects]
    return ProjectsPublic(data=data, count=len(data))


def _quotas(project: ProjectRecord) -> str:
    limits = {
        "weight": project.weight,
        "max_devices": project.max_devices,
        "max_queued": project.max_queued,
        "max_priority": project.max_priority,
        "storage_bytes": project.storage_bytes,
    }
    return ", ".join(f"{k} {v:g}" for k, v in limits.items() if v is not None)
