""":class:`AsyncClient`: :class:`hetsched.Client` for asyncio code, method for method.

    async with AsyncClient() as client:
        job = await client.submit(steps=100)
        async for event in client.follow(job.id):
            print(event)
        done = await client.wait(job.id)

The requests are :mod:`hetsched.calls`' (the same as the sync client's); local file
work (unpacking, exporting) runs in a thread so the event loop keeps going.
"""

from __future__ import annotations

import asyncio
import builtins
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
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


class AsyncClient(calls.Connection[httpx.AsyncClient]):
    """A connection to one hetsched service for asyncio; ``async with AsyncClient() as c``.
    Arguments, defaults, answers and errors as :class:`hetsched.Client`'s."""

    def _connect(
        self, *, base_url: str, headers: dict[str, str], timeout: float
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        tries = self._tries(call)
        while True:
            try:
                response = await self._http.send(tries.request(self._http), stream=stream)
            except httpx.TransportError as exc:
                await asyncio.sleep(tries.wait_after_error(exc))
                continue
            if response.status_code < 400:
                return response
            await response.aread()
            await asyncio.sleep(tries.wait_after_refusal(response))

    async def _run(self, call: Call[T]) -> T:
        return call.read(await self._send(call))

    async def submit(
        self, spec: JobCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> JobPublic:
        return await self._run(calls.submit(spec, fields))

    async def get(self, job_id: str) -> JobPublic:
        return await self._run(calls.get(job_id))

    async def list(
        self, *, state: JobState | str | None = None, limit: int = 100, offset: int = 0
    ) -> JobsPublic:
        return await self._run(calls.list_jobs(state, limit, offset))

    async def stop(self, job_id: str) -> JobPublic:
        return await self._run(calls.stop(job_id))

    async def delete(self, job_id: str) -> str:
        return await self._run(calls.delete(job_id))

    async def logs(self, job_id: str, *, since: int = 0) -> builtins.list[LogLine]:
        return await self._run(calls.logs(job_id, since))

    async def metrics(self, job_id: str, *, since: int = 0) -> Metrics:
        return await self._run(calls.metrics(job_id, since))

    async def follow(self, job_id: str, *, poll_s: float = 1.0) -> AsyncIterator[Event]:
        tail = Tail(job_id=job_id)
        while True:
            job_call, logs_call, metrics_call = tail.calls()
            job = await self._run(job_call)
            lines, steps = await self._run(logs_call), await self._run(metrics_call)
            for event in tail.take(job, lines, steps):
                yield event
            if tail.done:
                return
            await asyncio.sleep(poll_s)

    async def wait(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0
    ) -> JobPublic:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = await self.get(job_id)
            if job.state.terminal:
                if job.state is JobState.SUCCEEDED:
                    return job
                raise JobFailed(job)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(job, timeout_s or 0.0)
            await asyncio.sleep(calls.poll_wait_s(poll_s, deadline))

    async def checkpoints(self, job_id: str) -> builtins.list[CheckpointPublic]:
        return await self._run(calls.checkpoints(job_id))

    async def download(
        self, job_id: str, step: int | None = None, *, dest: str | Path = ".", extract: bool = True
    ) -> Path:
        if step is None:
            step = calls.latest_step(job_id, await self.checkpoints(job_id))
        archive, call = calls.download(job_id, step, dest)
        response = await self._send(call, stream=True)
        try:
            with archive.open("wb") as out:
                async for block in response.aiter_bytes():
                    out.write(block)
        finally:
            await response.aclose()
        if not extract:
            return archive
        return await asyncio.to_thread(extract_checkpoint, archive, archive.parent, step)

    async def export(
        self,
        job_id: str,
        output: str | Path,
        *,
        step: int | None = None,
        tokenizer: str | Path | None = None,
        dtype: str = "float32",
    ) -> builtins.list[Path]:
        with tempfile.TemporaryDirectory(prefix="hetsched-export-") as scratch:
            directory = await self.download(job_id, step, dest=scratch)
            return await asyncio.to_thread(
                export_checkpoint, directory, output, tokenizer=tokenizer, dtype=dtype
            )

    async def plan(
        self, spec: PlanCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> PlanPreview:
        return await self._run(calls.plan(spec, fields))

    async def cluster(self) -> ClusterPublic:
        return await self._run(calls.cluster())

    async def schedule(self) -> SchedulePublic:
        return await self._run(calls.schedule())

    async def datasets(self) -> builtins.list[DatasetPublic]:
        return await self._run(calls.datasets())

    async def upload(self, path: str | Path, *, name: str | None = None) -> DatasetPublic:
        path = Path(path)
        content = await asyncio.to_thread(read_upload, path)
        return await self._run(calls.upload(name or path.name, content))

    async def me(self) -> Me:
        return await self._run(accounts.me())

    async def users(self) -> builtins.list[UserPublic]:
        return await self._run(accounts.users())

    async def create_user(
        self, name: str, *, projects: Sequence[str] = (), is_admin: bool = False
    ) -> UserCreated:
        return await self._run(accounts.create_user(name, projects, is_admin))

    async def revoke_user(self, name: str) -> UserPublic:
        return await self._run(accounts.revoke_user(name))

    async def projects(self) -> builtins.list[ProjectPublic]:
        return await self._run(accounts.projects())

    async def create_project(self, name: str, **quotas: float | int | None) -> ProjectPublic:
        return await self._run(accounts.create_project(name, quotas))

    async def update_project(self, name: str, **quotas: float | int | None) -> ProjectPublic:
        return await self._run(accounts.update_project(name, quotas))

    async def audit(
        self, *, action: str | None = None, limit: int = 100, offset: int = 0
    ) -> AuditPublic:
        return await self._run(accounts.audit(action, limit, offset))
