"""The service's own documents: options for forms, health, one-line messages and errors."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from api.states import TERMINAL_STATES, JobState


class Message(BaseModel):
    message: str


class ErrorPublic(BaseModel):
    detail: str
    """One line naming the field or object and what is allowed."""


class Options(BaseModel):
    """What a submit form may offer, and the job states a client may see."""

    models: list[str]
    strategies: list[str]
    datasets: list[str]
    devices: list[str]
    job_states: list[JobState] = list(JobState)
    terminal_states: list[JobState] = sorted(TERMINAL_STATES)


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "error"]
    cluster: Literal["available", "unavailable"]
    executor: Literal["running", "disabled"]
    version: str
