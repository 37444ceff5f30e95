"""The client's errors: one type per way a call can fail, each carrying the API's one-line
message (``detail``) and the HTTP status it came with.

They derive from :class:`scheduler.errors.HetschedError`, so the ``hetsched`` command
line prints any of them as its one-line ``hetsched: error: ...``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from scheduler.errors import HetschedError

if TYPE_CHECKING:
    from api.schemas.jobs import JobPublic


class APIError(HetschedError):
    """The service answered with an error; ``str()`` is ``"STATUS: DETAIL"``."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        """The API's one-line message, naming the field or object and what is allowed."""


class InvalidRequest(APIError):
    """400 or 422: a field is out of range, a name unknown, the body malformed."""


class Unauthorized(APIError):
    """401: the token is missing or wrong."""


class Forbidden(APIError):
    """403: the token is right but may not do this (another project's job, an admin call)."""


class NotFound(APIError):
    """404: no such job, checkpoint, device."""


class Conflict(APIError):
    """409: not allowed in the object's state (deleting a running job), or nothing fits."""


class TooLarge(APIError):
    """413: an upload past the service's limit."""


class Unavailable(APIError):
    """503 (after the retries): the service or its cluster is not ready."""


STATUS_ERRORS: dict[int, type[APIError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: InvalidRequest,
    503: Unavailable,
}


class ConnectionFailed(HetschedError):
    """The service could not be reached, or its answer was lost (after the retries)."""

    def __init__(self, url: str, exc: Exception) -> None:
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            message = (
                f"cannot reach the control plane at {url} "
                "(is `hetsched serve` running? set --url or HETSCHED_URL)"
            )
        else:
            message = f"{url}: {type(exc).__name__}: {exc}"
        super().__init__(message)
        self.url = url
        self.reason = f"{type(exc).__name__}: {exc}"
        """What the transport said (``ConnectError: [Errno 111] Connection refused``)."""


class JobFailed(HetschedError):
    """:meth:`~hetsched.Client.wait`: the job ended FAILED or STOPPED; ``job`` is its record."""

    def __init__(self, job: JobPublic) -> None:
        because = f": {job.message}" if job.message else ""
        super().__init__(f"job {job.id} ended {job.state.value}{because}")
        self.job = job


class WaitTimeout(HetschedError):
    """:meth:`~hetsched.Client.wait`: the job had not ended in time; ``job`` is its record."""

    def __init__(self, job: JobPublic, timeout_s: float) -> None:
        super().__init__(
            f"wait: job {job.id} is still {job.state.value} after {timeout_s:g} s "
            f"({job.steps_done}/{job.steps} steps)"
        )
        self.job = job
        self.timeout_s = timeout_s
