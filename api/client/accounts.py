"""The requests of a shared service's accounts, for :class:`hetsched.Client` and
:class:`hetsched.AsyncClient` alike: who the caller is, users and their tokens, projects
and their quotas, the audit log. Everything but :func:`me` and :func:`projects` needs an
admin's token (a 403 otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from api.schemas.users import (
    AuditPublic,
    Me,
    ProjectPublic,
    ProjectsPublic,
    UserCreated,
    UserPublic,
    UsersPublic,
)
from hetsched.calls import Call, read_model


def me() -> Call[Me]:
    return Call(method="GET", path="/users/me", read=read_model(Me))


def users() -> Call[list[UserPublic]]:
    read = read_model(UsersPublic)
    return Call(method="GET", path="/users", read=lambda r: read(r).data)


def create_user(name: str, projects: Sequence[str], is_admin: bool) -> Call[UserCreated]:
    return Call(
        method="POST",
        path="/users",
        body={"name": name, "projects": list(projects), "is_admin": is_admin},
        idempotent=False,  # a lost answer may mean it was made: its token is then unknown
        read=read_model(UserCreated),
    )


def revoke_user(name: str) -> Call[UserPublic]:
    path = f"/users/{quote(name, safe='')}/revoke"
    return Call(method="POST", path=path, read=read_model(UserPublic))


def projects() -> Call[list[ProjectPublic]]:
    read = read_model(ProjectsPublic)
    return Call(method="GET", path="/projects", read=lambda r: read(r).data)


def create_project(name: str, quotas: dict[str, Any]) -> Call[ProjectPublic]:
    return Call(
        method="POST",
        path="/projects",
        body={"name": name, **quotas},
        idempotent=False,  # a second try after a lost answer says 409
        read=read_model(ProjectPublic),
    )


def update_project(name: str, quotas: dict[str, Any]) -> Call[ProjectPublic]:
    path = f"/projects/{quote(name, safe='')}"
    return Call(method="PATCH", path=path, body=quotas, read=read_model(ProjectPublic))


def audit(action: str | None, limit: int, offset: int) -> Call[AuditPublic]:
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    if action is not None:
        params["action"] = action
    return Call(method="GET", path="/audit", params=params, read=read_model(AuditPublic))
