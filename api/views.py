"""Turn store records and scheduler dataclasses into the API's pydantic models."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.execution.executor import Executor
from api.execution.scheduling import ScheduledJob
from api.schemas.cluster import ClusterPublic, DevicePublic, MeasuredSpeed, NodePublic
from api.schemas.jobs import AllocationPublic, JobEventPublic, JobPublic
from api.schemas.plans import PlanPublic
from api.schemas.profiles import ProfilePublic
from api.schemas.schedule import ScheduledJobPublic
from api.services import ClusterHandle
from api.store import (
    EventRecord,
    JobRecord,
    JobStore,
    ProfileRecord,
    event_record,
    job_record,
)
from scheduler.hardware.capacity import usable_capacity_bytes
from scheduler.planning.plan import Plan


def same_named(record: object, model: type[BaseModel]) -> dict[str, Any]:
    """The record's attributes that ``model`` has a field of the same name for.

    A record and its public model share most fields; this copies those once, so a
    converter names only what it renames or derives.
    """
    return {name: getattr(record, name) for name in model.model_fields if hasattr(record, name)}


def scheduled_job_public(row: ScheduledJob) -> ScheduledJobPublic:
    return ScheduledJobPublic.model_validate(
        {**same_named(row, ScheduledJobPublic), "id": row.job_id}
    )


def plan_public(plan: Plan) -> PlanPublic:
    return PlanPublic.model_validate(plan.to_dict())


def job_public(job: JobRecord, events: Sequence[EventRecord] = ()) -> JobPublic:
    """The job as the API shows it; ``events`` only where one job is read."""
    samples_per_s = None
    if job.measured_step_s:
        samples_per_s = job.spec.global_batch / job.measured_step_s
    return JobPublic.model_validate(
        {
            **same_named(job, JobPublic),
            "plan": plan_public(job.plan) if job.plan else None,
            "steps": job.spec.steps,
            "progress": min(1.0, job.steps_done / job.spec.steps),
            "samples_per_s": samples_per_s,
            "events": [
                JobEventPublic.model_validate(e, from_attributes=True)
                for e in events
                if e.kind != "allocation"
            ],
            "allocations": [allocation_public(e) for e in events if e.kind == "allocation"],
        }
    )


@dataclass(frozen=True)
class _Page:
    writes: int
    """The store's write count taken before the rows below were read."""
    read_at: float
    project: str
    rows: tuple[Any, ...]
    body: bytes


class JobPages:
    """``GET /jobs/{id}``'s answers as JSON, built again only when the job or its events
    changed: fifty dashboards polling one training job share one build per step instead
    of reading the database and serializing the same plan fifty times.

    An answer is reused without reading the database while the store has written
    nothing since its rows were read (:class:`api.core.db.WriteCount`; one service owns
    its database, :mod:`api.core.lock`) and for at most :attr:`max_age_s`, which bounds
    what a write from outside the service (a second process on the database) can leave
    unseen. Past that, the rows are read again and compared before anything is parsed.
    """

    def __init__(self, max_jobs: int = 256, max_age_s: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._max_jobs = max_jobs
        self.max_age_s = max_age_s
        self._pages: OrderedDict[str, _Page] = OrderedDict()
        self._flights: dict[tuple[str, int], asyncio.Future[_Page | None]] = {}
        """Reads under way (on the event loop's side), by job and write count at start."""

    def cached(self, store: JobStore, job_id: str, readable: Callable[[str], bool]) -> bytes | None:
        """The job's answer if nothing was written since it was built, with no read;
        None: :meth:`answer` it (it may still be unchanged, or not exist)."""
        page = self._pages.get(job_id)
        if (
            page is None
            or page.writes != store.writes.value
            or time.monotonic() - page.read_at > self.max_age_s
            or not readable(page.project)
        ):
            return None
        return page.body

    async def answer(
        self, store: JobStore, job_id: str, readable: Callable[[str], bool]
    ) -> bytes | None:
        """The job's answer, or None when there is no such job or ``readable`` refuses
        its project: :meth:`cached`, else one read in the thread pool, shared by every
        request that comes while it runs with nothing written since it started (after
        each step's write, fifty pollers would otherwise make fifty reads at once)."""
        body = self.cached(store, job_id, readable)
        if body is not None:
            return body
        key = (job_id, store.writes.value)
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(run_in_threadpool(self.read, store, job_id))
            self._flights[key] = flight
            flight.add_done_callback(lambda _: self._flights.pop(key, None))
        page = await asyncio.shield(flight)
        return page.body if page is not None and readable(page.project) else None

    def read(self, store: JobStore, job_id: str) -> _Page | None:
        """Read the job's and its events' rows and build its answer, unless the rows are
        those of the answer built before; None: no such job."""
        writes, read_at = store.writes.value, time.monotonic()
        rows = store.job_rows(job_id)
        if rows is None:
            return None
        job_row, event_rows = rows
        key = (tuple(job_row), *(tuple(e) for e in event_rows))
        with self._lock:
            cached = self._pages.get(job_id)
        if cached is not None and cached.rows == key:
            body = cached.body
        else:
            job = job_record(job_row)
            public = job_public(job, [event_record(e) for e in event_rows])
            body = public.model_dump_json(by_alias=True).encode()
        page = _Page(writes, read_at, job_row.project, key, body)
        with self._lock:
            self._pages[job_id] = page
            self._pages.move_to_end(job_id)
            while len(self._pages) > self._max_jobs:
                self._pages.popitem(last=False)
        return page


def allocation_public(event: EventRecord) -> AllocationPublic:
    data = event.data
    return AllocationPublic(
        time=event.time,
        step=event.step,
        policy=str(data.get("policy", "")),
        from_devices=list(data.get("from", [])),
        devices=list(data.get("to", [])),
        reason=str(data.get("reason", "")),
    )


def profile_public(record: ProfileRecord) -> ProfilePublic:
    return ProfilePublic.model_validate(record, from_attributes=True)


def _latest_speeds(store: JobStore) -> dict[str, MeasuredSpeed]:
    """Each device's figures from its most recent measured profile."""
    speeds: dict[str, MeasuredSpeed] = {}
    for record in store.profiles():  # newest first
        if record.source == "analytic":
            continue
        for d in record.profile.get("devices", []):
            if d.get("id") in speeds or not d.get("per_sample_s"):
                continue
            speeds[d["id"]] = MeasuredSpeed(
                model=record.model,
                fixed_s=d["fixed_s"],
                per_sample_s=d["per_sample_s"],
                samples_per_s=1.0 / d["per_sample_s"],
            )
    return speeds


def cluster_public(
    handle: ClusterHandle,
    store: JobStore,
    executor: Executor | None,
) -> ClusterPublic:
    cluster = handle.cluster
    shown = same_named(handle, ClusterPublic)  # available, message, simulated, ray_address
    if cluster is None:
        return ClusterPublic.model_validate(
            {
                **shown,
                "name": "unavailable",
                "available": False,
                "links": {},
                "nodes": [],
                "num_devices": 0,
            }
        )
    busy = executor.busy_devices() if executor else {}
    live = {job.job_id: job for job in executor.live()} if executor else {}
    speeds = _latest_speeds(store)
    lost = handle.pool.lost() if handle.pool is not None and handle.available else set()
    nodes: dict[str, list[DevicePublic]] = {}
    for d in cluster.devices:
        job_id = busy.get(d.id)
        busy_ratio = memory_bytes = None
        job = live.get(job_id) if job_id else None
        if job is not None and d.id in job.device_steps and job.step_s:
            busy_s, _wait_s, peak = job.device_steps[d.id]
            busy_ratio, memory_bytes = min(1.0, busy_s / job.step_s), peak
        status: Literal["idle", "busy", "unavailable", "lost"] = (
            "lost"
            if d.id in lost
            else "busy"
            if job_id
            else ("idle" if handle.available else "unavailable")
        )
        nodes.setdefault(d.node, []).append(
            DevicePublic(
                id=d.id,
                node=d.node,
                type=d.type,
                memory_gb=d.memory_gb,
                capacity_bytes=usable_capacity_bytes(
                    d.memory_bytes,
                    simulated=handle.simulated,
                    memory_scale=cluster.simulation.memory_scale,
                ),
                peak_tflops=d.peak_tflops,
                status=status,
                job_id=job_id,
                measured=speeds.get(d.id),
                busy_ratio=busy_ratio,
                memory_bytes=memory_bytes,
            )
        )
    return ClusterPublic.model_validate(
        {
            **shown,
            "name": cluster.name,
            "links": cluster.links.cluster_wide(),
            "nodes": [
                NodePublic(name=n, devices=devs, links=cluster.links.own(n).to_dict())
                for n, devs in nodes.items()
            ],
            "num_devices": len(cluster.devices),
        }
    )
