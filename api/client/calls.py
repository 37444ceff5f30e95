"""What each client method asks the API, written once for :class:`hetsched.Client` and
:class:`hetsched.AsyncClient`: the request (:class:`Call`), how its answer is read, which
failures are retried, and the state of a :class:`Tail` that follows a job.

Retries follow the usual rule of HTTP clients (urllib3's ``Retry``, Ray's job client):
a refused connection never reached the service, so any call is retried; a lost answer
or a 503 only for idempotent calls. A submission is made idempotent by the
``submission_id`` every submit carries: a retried submit returns the job it made.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from api.schemas.cluster import ClusterPublic
from api.schemas.datasets import DatasetPublic, DatasetsPublic
from api.schemas.jobs import (
    CheckpointPublic,
    CheckpointsPublic,
    JobCreate,
    JobLogsPublic,
    JobMetricsPublic,
    JobPublic,
    JobsPublic,
    LogLine,
    StepPublic,
)
from api.schemas.plans import PlanCreate, PlanPreview
from api.schemas.schedule import SchedulePublic
from api.schemas.service import Message
from api.states import JobState
from hetsched.errors import STATUS_ERRORS, APIError, ConnectionFailed
from scheduler.errors import HetschedError

T = TypeVar("T")
Model = TypeVar("Model", bound=BaseModel)
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
DEFAULT_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1"


def default_url() -> str:
    return os.environ.get("HETSCHED_URL") or DEFAULT_URL


def default_token() -> str | None:
    """A user's own token (``HETSCHED_TOKEN``), else the service's (``HETSCHED_API_TOKEN``)."""
    return os.environ.get("HETSCHED_TOKEN") or os.environ.get("HETSCHED_API_TOKEN") or None


def endpoint(url: str | None, token: str | None) -> tuple[str, str, dict[str, str]]:
    """The service's address, the API's base URL and the headers every call carries, from
    the arguments or else the environment (:func:`default_url`, :func:`default_token`)."""
    url = (url or default_url()).rstrip("/")
    token = token if token is not None else default_token()
    return url, url + API_PREFIX, {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    """How often and how patiently a failed call is tried again."""

    attempts: int = 4
    """Tries in all (1: never retry)."""
    backoff_s: float = 0.25
    """The wait before the second try; it doubles each time."""
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(
                f"Retry: attempts must be >= 1 and waits >= 0, got attempts={self.attempts}, "
                f"backoff_s={self.backoff_s}, max_backoff_s={self.max_backoff_s}"
            )

    def waits_s(self) -> Iterator[float]:
        """The waits between tries: backoff_s, 2·backoff_s, ... (attempts − 1 of them)."""
        for attempt in range(self.attempts - 1):
            yield min(self.max_backoff_s, self.backoff_s * 2**attempt)


@dataclass(frozen=True, kw_only=True, slots=True)
class Call(Generic[T]):
    """One request and how its answer becomes ``T``."""

    method: str
    path: str
    """Under ``/api/v1``."""
    read: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    body: Any = None
    """A JSON document."""
    content: bytes | None = None
    """A raw body (uploads)."""
    idempotent: bool = True
    """Safe to send again when the answer was lost or said 503."""


def _retryable(call: Call[Any], exc: Exception | None, status: int) -> bool:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return True  # nothing reached the service
    if not call.idempotent:
        return False
    return status == 503 or isinstance(exc, httpx.TransportError)


class Tries:
    """One call's tries: the request to send each time, and after each failure how long to
    wait before the next (:attr:`Retry.waits_s`, a 503's ``Retry-After`` counted) or, once
    no try is left or the failure is not one to retry, the typed error to raise."""

    def __init__(self, call: Call[Any], *, url: str, retry: Retry) -> None:
        self.call, self.url = call, url
        self._waits_s = retry.waits_s()

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        c = self.call
        return http.build_request(c.method, c.path, params=c.params, json=c.body, content=c.content)

    def wait_after_error(self, exc: httpx.TransportError) -> float:
        """Seconds before the next try after ``exc``; raises :class:`ConnectionFailed`."""
        wait_s = next(self._waits_s, None) if _retryable(self.call, exc, 0) else None
        if wait_s is None:
            raise ConnectionFailed(self.url, exc) from exc
        return wait_s

    def wait_after_refusal(self, response: httpx.Response) -> float:
        """Seconds before the next try after an answer of 400 or more (read whole);
        raises its :func:`error_of`."""
        status = response.status_code
        wait_s = next(self._waits_s, None) if _retryable(self.call, None, status) else None
        if wait_s is None:
            raise error_of(response)
        return max(wait_s, min(retry_after_s(response) or 0.0, 30.0))


class Connection(ABC, Generic[H]):
    """What :class:`hetsched.Client` and :class:`hetsched.AsyncClient` are built from: the
    service's address, the retry rule and one ``httpx`` client ``H`` that carries the token."""

    _http: H

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retry: Retry | None = None,
    ) -> None:
        self.url, base_url, headers = endpoint(url, token)
        self.retry = retry or Retry()
        self._http = self._connect(base_url=base_url, headers=headers, timeout=timeout_s)

    @abstractmethod
    def _connect(self, *, base_url: str, headers: dict[str, str], timeout: float) -> H: ...

    def _tries(self, call: Call[Any]) -> Tries:
        return Tries(call, url=self.url, retry=self.retry)


def retry_after_s(response: httpx.Response) -> float | None:
    """A 503's ``Retry-After`` in seconds, when it gives a number."""
    value = response.headers.get("retry-after", "")
    return float(value) if value.replace(".", "", 1).isdigit() else None


def error_of(response: httpx.Response) -> APIError:
    """The typed error of an answer of 400 or more, with the API's one-line ``detail``."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if detail is None:
        detail = response.text.strip() or response.reason_phrase
    elif not isinstance(detail, str):
        detail = json.dumps(detail)
    return STATUS_ERRORS.get(response.status_code, APIError)(response.status_code, detail)


class Metrics(list[StepPublic]):
    """A job's steps, oldest first, each a :class:`~api.schemas.jobs.StepPublic`."""

    def to_pandas(self) -> Any:
        """One row per step (``step``, ``loss``, ``val_loss``, ``step_s``, ``samples_per_s``,
        ``time``), indexed by step; needs pandas."""
        try:
            import pandas  # type: ignore[import-untyped,unused-ignore]  # optional
        except ImportError:
            raise HetschedError("metrics: to_pandas needs pandas (pip install pandas)") from None
        rows = [s.model_dump(exclude={"devices"}) for s in self]
        columns = ["step", "loss", "val_loss", "step_s", "samples_per_s", "time"]
        return pandas.DataFrame(rows, columns=columns).set_index("step")


def read_model(kind: type[Model]) -> Callable[[httpx.Response], Model]:
    return lambda response: kind.model_validate_json(response.content)


def _job_path(job_id: str, *rest: str) -> str:
    return "/".join([f"/jobs/{quote(job_id, safe='')}", *rest])


def _fields(
    spec: BaseModel | Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """A request document from a schema object or mapping, updated by keyword fields; the
    server validates it (and names what is wrong in one line)."""
    if isinstance(spec, BaseModel):
        doc = spec.model_dump(mode="json", exclude_unset=True)
    else:
        doc = dict(spec or {})
    doc.update(fields)
    return doc


def submit(
    spec: JobCreate | Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> Call[JobPublic]:
    doc = _fields(spec, fields)
    doc.setdefault("submission_id", None)
    if doc["submission_id"] is None:
        doc["submission_id"] = f"client-{uuid.uuid4().hex}"  # a retried submit is one job
    return Call(method="POST", path="/jobs", body=doc, read=read_model(JobPublic))


def get(job_id: str) -> Call[JobPublic]:
    return Call(method="GET", path=_job_path(job_id), read=read_model(JobPublic))


def list_jobs(state: JobState | str | None, limit: int, offset: int) -> Call[JobsPublic]:
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    if state is not None:
        params["state"] = str(state)
    return Call(method="GET", path="/jobs", params=params, read=read_model(JobsPublic))


def stop(job_id: str) -> Call[JobPublic]:
    return Call(method="POST", path=_job_path(job_id, "stop"), read=read_model(JobPublic))


def delete(job_id: str) -> Call[str]:
    read = read_model(Message)
    return Call(method="DELETE", path=_job_path(job_id), read=lambda r: read(r).message)


def logs(job_id: str, since: int) -> Call[list[LogLine]]:
    read = read_model(JobLogsPublic)
    return Call(
        method="GET",
        path=_job_path(job_id, "logs"),
        params={"since": since},
        read=lambda r: read(r).data,
    )


def metrics(job_id: str, since: int) -> Call[Metrics]:
    read = read_model(JobMetricsPublic)
    return Call(
        method="GET",
        path=_job_path(job_id, "metrics"),
        params={"since": since},
        read=lambda r: Metrics(read(r).data),
    )


def checkpoints(job_id: str) -> Call[list[CheckpointPublic]]:
    read = read_model(CheckpointsPublic)
    return Call(method="GET", path=_job_path(job_id, "checkpoints"), read=lambda r: read(r).data)


def download(job_id: str, step: int, dest: str | Path) -> tuple[Path, Call[httpx.Response]]:
    """Where the ``.tar.gz`` of the checkpoint of ``step`` goes under ``dest`` (made), and
    the call that streams it."""
    directory = Path(dest)
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / f"{job_id}-step-{step:08d}.tar.gz"
    path = _job_path(job_id, "checkpoints", str(step))
    return archive, Call(method="GET", path=path, read=lambda response: response)


def plan(
    spec: PlanCreate | Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> Call[PlanPreview]:
    return Call(
        method="POST", path="/plans", body=_fields(spec, fields), read=read_model(PlanPreview)
    )


def cluster() -> Call[ClusterPublic]:
    return Call(method="GET", path="/cluster", read=read_model(ClusterPublic))


def schedule() -> Call[SchedulePublic]:
    return Call(method="GET", path="/schedule", read=read_model(SchedulePublic))


def datasets() -> Call[list[DatasetPublic]]:
    read = read_model(DatasetsPublic)
    return Call(method="GET", path="/datasets", read=lambda r: read(r).data)


def upload(name: str, content: bytes) -> Call[DatasetPublic]:
    return Call(
        method="POST",
        path="/datasets",
        params={"name": name},
        content=content,
        idempotent=False,  # a lost answer may mean it was stored: a second try says 409
        read=read_model(DatasetPublic),
    )


def poll_wait_s(poll_s: float, deadline: float | None) -> float:
    """The next pause of a poll: ``poll_s``, or less when ``deadline`` (monotonic) is nearer."""
    if deadline is None:
        return poll_s
    return min(poll_s, max(0.0, deadline - time.monotonic()))


def latest_step(job_id: str, kept: list[CheckpointPublic]) -> int:
    if not kept:
        raise HetschedError(f"checkpoint: job {job_id} has no checkpoint yet")
    return kept[-1].step


Event = LogLine | StepPublic
"""What :meth:`hetsched.Client.follow` yields: a log line, or a step's metrics."""


@dataclass(kw_only=True, slots=True)
class Tail:
    """Where following a job has got to: the log lines and steps already seen."""

    job_id: str
    log_offset: int = 0
    next_step: int = 0
    job: JobPublic | None = field(default=None)

    def calls(self) -> tuple[Call[JobPublic], Call[list[LogLine]], Call[Metrics]]:
        """The job first: when it is already over, the lines and steps read after it are
        the last there will be."""
        return (
            get(self.job_id),
            logs(self.job_id, self.log_offset),
            metrics(self.job_id, self.next_step),
        )

    def take(self, job: JobPublic, lines: list[LogLine], steps: Metrics) -> list[Event]:
        """The new lines and steps, in time order; remembers where they end."""
        self.job = job
        self.log_offset += len(lines)
        if steps:
            self.next_step = steps[-1].step + 1
        events: list[Event] = [*lines, *steps]
        return sorted(events, key=lambda event: event.time)

    @property
    def done(self) -> bool:
        return self.job is not None and self.job.state.terminal
