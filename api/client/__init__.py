"""hetsched's Python client: :class:`Client` and its async twin :class:`AsyncClient`, over
the REST API, with typed answers (api.schemas) and errors (:mod:`hetsched.errors`).

Installed as ``hetsched`` from api/client/; imports api.schemas, api.states, api.core
(to export checkpoints) and scheduler.errors, never the app or the commands.
"""

from hetsched.aio import AsyncClient
from hetsched.calls import Event, Metrics, Retry
from hetsched.errors import (
    APIError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidRequest,
    JobFailed,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from hetsched.sync import Client
from scheduler.errors import HetschedError

__all__ = [
    "APIError",
    "AsyncClient",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Event",
    "Forbidden",
    "HetschedError",
    "InvalidRequest",
    "JobFailed",
    "Metrics",
    "NotFound",
    "Retry",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]
