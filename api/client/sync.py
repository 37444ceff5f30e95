""":class:`Client`: the control plane's REST API from a script or a notebook.

    from hetsched import Client

    client = Client("http://gpu-lab:8000", token="...")    # or $HETSCHED_URL, $HETSCHED_TOKEN
    job = client.submit(model="gpt-tiny", global_batch=32, steps=200)
    for event in client.follow(job.id):
        print(event)
    done = client.wait(job.id)                            # raises JobFailed unless SUCCEEDED
    frame = client.metrics(job.id).to_pandas()

The requests themselves are in :mod:`hetsched.calls`, shared with :class:`AsyncClient`.
"""

from __future__ import annotations

import builtins
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from api.schemas.cluster import ClusterPublic
from api.schemas.datasets import DatasetPublic
from api.schemas.jobs import CheckpointPublic, JobCreate, JobPublic, JobsPublic, LogLine
from api.schemas.plans import PlanCreate, PlanPreview
from api.schemas.schedule import SchedulePublic
from api.schemas.users import AuditPublic, Me, ProjectPublic, UserCreated, UserPublic
from api.states import JobState
from hetsched import accounts, calls
from hetsched.calls import Call, Event, Metrics, Tail
from hetsched.errors import JobFailed, WaitTimeout
from hetsched.files import export_checkpoint, extract_checkpoint, read_upload

T = TypeVar("T")


class Client(calls.Connection[httpx.Client]):
    """A connection to one hetsched service; a context manager (``with Client() as c``).

    ``url`` defaults to ``$HETSCHED_URL`` (else http://127.0.0.1:8000); ``token`` to
    ``$HETSCHED_TOKEN``, else ``$HETSCHED_API_TOKEN``, sent as ``Authorization: Bearer``.
    Errors are :mod:`hetsched.errors` types; refused connections and 503s are retried as
    ``retry`` says.
    """

    def _connect(self, *, base_url: str, headers: dict[str, str], timeout: float) -> httpx.Client:
        return httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        """The answer to ``call`` (status below 400), after the retries ``retry`` allows."""
        tries = self._tries(call)
        while True:
            try:
                response = self._http.send(tries.request(self._http), stream=stream)
            except httpx.TransportError as exc:
                time.sleep(tries.wait_after_error(exc))
                continue
            if response.status_code < 400:
                return response
            response.read()
            time.sleep(tries.wait_after_refusal(response))

    def _run(self, call: Call[T]) -> T:
        return call.read(self._send(call))

    def submit(
        self, spec: JobCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> JobPublic:
        """Queue a job from a :class:`~api.schemas.jobs.JobCreate`, a mapping of its fields,
        or keyword fields (``model=``, ``global_batch=``, ``steps=``, ...). Without a
        ``submission_id`` one is made, so a retried submit never makes a second job."""
        return self._run(calls.submit(spec, fields))

    def get(self, job_id: str) -> JobPublic:
        return self._run(calls.get(job_id))

    def list(
        self, *, state: JobState | str | None = None, limit: int = 100, offset: int = 0
    ) -> JobsPublic:
        """Jobs, newest first; ``count`` is how many match over all pages."""
        return self._run(calls.list_jobs(state, limit, offset))

    def stop(self, job_id: str) -> JobPublic:
        """A pending job stops at once, a running one after its current step."""
        return self._run(calls.stop(job_id))

    def delete(self, job_id: str) -> str:
        """Delete a finished job with its records; the service's one-line answer."""
        return self._run(calls.delete(job_id))

    def logs(self, job_id: str, *, since: int = 0) -> builtins.list[LogLine]:
        """The job's log lines from line ``since`` on."""
        return self._run(calls.logs(job_id, since))

    def metrics(self, job_id: str, *, since: int = 0) -> Metrics:
        """The job's steps from step ``since`` on; ``.to_pandas()`` makes a frame."""
        return self._run(calls.metrics(job_id, since))

    def follow(self, job_id: str, *, poll_s: float = 1.0) -> Iterator[Event]:
        """Log lines and steps' metrics as the job makes them, until it ends."""
        tail = Tail(job_id=job_id)
        while True:
            job_call, logs_call, metrics_call = tail.calls()
            yield from tail.take(self._run(job_call), self._run(logs_call), self._run(metrics_call))
            if tail.done:
                return
            time.sleep(poll_s)

    def wait(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> JobPublic:
        """The job once it SUCCEEDED; :class:`~hetsched.errors.JobFailed` if it ended
        otherwise, :class:`~hetsched.errors.WaitTimeout` past ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if job.state.terminal:
                if job.state is JobState.SUCCEEDED:
                    return job
                raise JobFailed(job)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job, timeout_s or 0.0)
            time.sleep(calls.poll_wait_s(poll_s, deadline))

    def checkpoints(self, job_id: str) -> builtins.list[CheckpointPublic]:
        """The job's kept checkpoints, oldest first."""
        return self._run(calls.checkpoints(job_id))

    def download(
        self, job_id: str, step: int | None = None, *, dest: str | Path = ".", extract: bool = True
    ) -> Path:
        """The checkpoint of ``step`` (default the latest) under ``dest``: its directory
        ``step-NNNNNNNN`` (any plan loads it; ``hetsched export`` reads it), or with
        ``extract=False`` the ``.tar.gz`` the service sent."""
        if step is None:
            step = calls.latest_step(job_id, self.checkpoints(job_id))
        archive, call = calls.download(job_id, step, dest)
        response = self._send(call, stream=True)
        try:
            with archive.open("wb") as out:
                for block in response.iter_bytes():
                    out.write(block)
        finally:
            response.close()
        return extract_checkpoint(archive, archive.parent, step) if extract else archive

    def export(
        self,
        job_id: str,
        output: str | Path,
        *,
        step: int | None = None,
        tokenizer: str | Path | None = None,
        dtype: str = "float32",
    ) -> builtins.list[Path]:
        """The checkpoint of ``step`` (default the latest) as a Hugging Face model directory
        (``config.json``, ``model.safetensors``); the files written. Needs torch."""
        with tempfile.TemporaryDirectory(prefix="hetsched-export-") as scratch:
            directory = self.download(job_id, step, dest=scratch)
            return export_checkpoint(directory, output, tokenizer=tokenizer, dtype=dtype)

    def plan(
        self, spec: PlanCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> PlanPreview:
        """The plan a job of this spec would get (nothing is trained)."""
        return self._run(calls.plan(spec, fields))

    def cluster(self) -> ClusterPublic:
        return self._run(calls.cluster())

    def schedule(self) -> SchedulePublic:
        return self._run(calls.schedule())

    def datasets(self) -> builtins.list[DatasetPublic]:
        return self._run(calls.datasets())

    def upload(self, path: str | Path, *, name: str | None = None) -> DatasetPublic:
        """Store a dataset file (``.txt``, ``.bin`` after its ``.bin.json``, a tokenizer) in
        the service's data directory under ``name`` (default its file name)."""
        path = Path(path)
        return self._run(calls.upload(name or path.name, read_upload(path)))

    def me(self) -> Me:
        """Who this client's token says it is."""
        return self._run(accounts.me())

    def users(self) -> builtins.list[UserPublic]:
        """Every user (admins)."""
        return self._run(accounts.users())

    def create_user(
        self, name: str, *, projects: Sequence[str] = (), is_admin: bool = False
    ) -> UserCreated:
        """A user in ``projects`` (each must exist), with the token shown this once (admins)."""
        return self._run(accounts.create_user(name, projects, is_admin))

    def revoke_user(self, name: str) -> UserPublic:
        """The user's token stops working at once (admins)."""
        return self._run(accounts.revoke_user(name))

    def projects(self) -> builtins.list[ProjectPublic]:
        """Every project for an admin, the caller's own otherwise."""
        return self._run(accounts.projects())

    def create_project(self, name: str, **quotas: float | int | None) -> ProjectPublic:
        """A project with its quotas (``max_devices=``, ``weight=``, ...; admins)."""
        return self._run(accounts.create_project(name, quotas))

    def update_project(self, name: str, **quotas: float | int | None) -> ProjectPublic:
        """Change the quotas given; ``None`` lifts one (admins)."""
        return self._run(accounts.update_project(name, quotas))

    def audit(self, *, action: str | None = None, limit: int = 100, offset: int = 0) -> AuditPublic:
        """Who did what, newest first; ``action`` (``job.delete``, say): only those (admins)."""
        return self._run(accounts.audit(action, limit, offset))
