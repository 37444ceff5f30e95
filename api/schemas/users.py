"""Users, projects and the audit log: what an admin sends and what the API shows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, StrictBool

ACCOUNT_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
AccountName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=ACCOUNT_PATTERN,
        description="Lower-case letters, digits and '_.-', starting with a letter or digit.",
    ),
]
"""A user's or a project's name."""


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


Number = BeforeValidator(_no_bool)
"""``false`` is no byte count (pydantic would read it as 0); ``5.0`` still is one."""
ACTION_PATTERN = r"^[a-z]+(\.[a-z]+)?$"
"""An audit action's shape: ``job.delete``, ``device.fail``."""


class ProjectQuotas(BaseModel):
    """A project's limits; a missing or null limit: none."""

    weight: Annotated[float, Number] = Field(
        default=1.0,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="Share of the cluster against other projects (fair and goodput policies).",
    )
    max_devices: Annotated[int | None, Number] = Field(
        default=None, ge=1, le=100_000, description="Most devices its jobs hold at once."
    )
    max_queued: Annotated[int | None, Number] = Field(
        default=None, ge=0, le=1_000_000, description="Most of its jobs waiting at once."
    )
    max_priority: Annotated[float | None, Number] = Field(
        default=None,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description="Highest priority its jobs may ask for.",
    )
    storage_bytes: Annotated[int | None, Number] = Field(
        default=None, ge=0, le=10**15, description="Most bytes of datasets it may upload."
    )


class ProjectCreate(ProjectQuotas):
    name: AccountName


class ProjectUpdate(BaseModel):
    """Only the quotas given change; ``null`` lifts a limit."""

    weight: Annotated[float, Number] = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    max_devices: Annotated[int | None, Number] = Field(default=None, ge=1, le=100_000)
    max_queued: Annotated[int | None, Number] = Field(default=None, ge=0, le=1_000_000)
    max_priority: Annotated[float | None, Number] = Field(
        default=None, gt=0, le=1000, allow_inf_nan=False
    )
    storage_bytes: Annotated[int | None, Number] = Field(default=None, ge=0, le=10**15)


class ProjectPublic(ProjectQuotas):
    name: str
    created_at: datetime


class ProjectsPublic(BaseModel):
    data: list[ProjectPublic]
    count: int


class UserCreate(BaseModel):
    name: AccountName
    projects: list[AccountName] = Field(
        default_factory=list,
        max_length=100,
        description="Projects the user belongs to (each must exist).",
    )
    is_admin: StrictBool = False


class UserPublic(BaseModel):
    name: str
    is_admin: bool
    projects: list[str]
    created_at: datetime
    revoked_at: datetime | None = None


class UserCreated(UserPublic):
    token: str
    """The user's API token: shown this once, stored only as its SHA-256."""


class UsersPublic(BaseModel):
    data: list[UserPublic]
    count: int


class Me(BaseModel):
    """Who the caller's token says they are."""

    name: str | None
    """Null without a token (reads opened by HETSCHED_OPEN_READS)."""
    is_admin: bool
    projects: list[str]
    single_user: bool
    """No token is configured anywhere: everyone on loopback is the admin."""


class AuditEntryPublic(BaseModel):
    id: int
    time: datetime
    actor: str
    action: str
    """``job.submit``, ``job.stop``, ``job.delete``, ``device.fail``, ``user.add``, ..."""
    target: str
    project: str | None
    detail: str


class AuditPublic(BaseModel):
    data: list[AuditEntryPublic]
    count: int
