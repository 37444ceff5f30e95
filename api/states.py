"""Job states, defined once: the store writes them, the API documents them as an enum,
and the dashboard gets them rendered into its page (api/routes/dashboard.py)."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """Job states as Ray's job API has them; the last three are terminal."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.STOPPED, JobState.SUCCEEDED, JobState.FAILED})
"""A job in one of these never changes state again."""
