"""Profiles: a request to measure the cluster, and the profile document of DESIGN.md."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from api.schemas.fields import (
    DeviceIds,
    RequestModel,
)
from api.schemas.plans import ModelRef


class ProfileCreate(RequestModel):
    """Measure (or re-measure) the cluster's devices for a model."""

    model: ModelRef = "gpt-tiny"
    devices: DeviceIds | None = Field(
        default=None, description="Device ids to use; all when absent."
    )
    refresh: bool = Field(default=False, description="Measure again even when cached.")


class ProfilePublic(BaseModel):
    id: int
    model: str
    cluster: str
    source: str
    created_at: datetime
    profile: dict[str, Any]
    """The profile document of DESIGN.md."""


class ProfilesPublic(BaseModel):
    data: list[ProfilePublic]
    count: int
