"""The scheduling policy's view (``GET /schedule``): who holds what, who waits and why."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel


class ScheduledJobPublic(BaseModel):
    """A job in the latest scheduling round."""

    id: str
    name: str
    status: Literal["running", "moving", "waiting", "pinned"]
    """``moving``: checkpointing to go to ``devices``; ``pinned``: it named its devices."""
    held: list[str]
    """Devices it runs on now."""
    devices: list[str]
    """Devices the round gave it (for a waiting job: those it waits for, if any)."""
    samples_per_s: float
    """The policy's planned rate on ``devices``."""
    reason: str
    """Why it got these devices, or why it waits."""
    priority: float
    waiting_s: float
    owner: str = ""
    project: str = ""


class ProjectUsagePublic(BaseModel):
    """A project's quotas and what it uses of them now (a null limit: none)."""

    name: str
    weight: float
    """Its share of the cluster against the other projects' (fair, goodput)."""
    max_devices: int | None
    devices_held: int
    max_queued: int | None
    queued: int
    max_priority: float | None
    storage_bytes: int | None
    storage_used_bytes: int


class SchedulePublic(BaseModel):
    """``GET /schedule``: the policy in force and its latest round."""

    policy: str
    round_s: float
    decided_at: datetime | None
    """When the latest round ran (null before the first, or with the executor off)."""
    solver: str
    """What was exact and what heuristic in the latest decision."""
    rates: dict[str, str]
    """Model -> ``measured`` or ``analytic``: where the policy's rates came from."""
    allocation: dict[str, list[str]]
    """Job id -> devices it holds now."""
    devices: dict[str, str | None]
    """Device id -> job id holding it (null: free)."""
    queue: list[ScheduledJobPublic]
    """Waiting jobs, each with why it waits."""
    jobs: list[ScheduledJobPublic]
    """Every running and waiting job with the round's reason."""
    projects: list[ProjectUsagePublic] = []
    """The caller's projects (an admin's: all): quotas and usage."""
