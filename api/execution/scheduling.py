"""What the executor hands the scheduling policy, and what it keeps of its decisions.

A job record becomes a :class:`~scheduler.policy.types.JobDemand`; the rates come from
one :class:`~scheduler.policy.rates.PlannedRates` per cluster, measured where the
store has profiles (:class:`Demands`); each round leaves a :class:`Schedule`, which
``GET /api/v1/schedule`` shows.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from api.accounts import ProjectRecord
from api.execution.ledger import LiveJob
from api.schemas.jobs import JobCreate
from api.services import model_from_ref, model_key
from api.store import JobRecord, JobStore
from scheduler.cost.profile import DeviceProfile, Profile, profile_from_dict
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster
from scheduler.models.presets import PRESETS, ModelPreset
from scheduler.policy.rates import PlannedRates
from scheduler.policy.types import Allocation, JobDemand

JobStatus = Literal["running", "moving", "waiting", "pinned"]
PINNED: Final = "pinned"
"""A pinned job's status in the schedule and ``policy`` in its allocation events."""


def pinned_reason(num_devices: int) -> str:
    return f"pinned: runs on the {num_devices} device(s) it named"


def check_device_counts(spec: JobCreate, num_devices: int) -> None:
    """Refuse, at submit, device counts this cluster can never satisfy (one line, 422)."""
    if spec.max_devices is not None and spec.max_devices < spec.min_devices:
        raise HetschedError(
            f"max_devices: {spec.max_devices} is below min_devices {spec.min_devices}"
        )
    if spec.devices is not None and spec.min_devices > len(spec.devices):
        raise HetschedError(
            f"min_devices: {spec.min_devices} is more than the {len(spec.devices)} device(s) "
            "the job names in devices"
        )
    if num_devices and spec.min_devices > num_devices:
        raise HetschedError(
            f"min_devices: {spec.min_devices} is more than the cluster's {num_devices} devices"
        )
    if num_devices and spec.max_devices is not None and spec.max_devices > num_devices:
        raise HetschedError(
            f"max_devices: {spec.max_devices} is more than the cluster's {num_devices} devices"
        )


def quota_reason(project: ProjectRecord | None, *, held: int, need: int, promised: int = 0) -> str:
    """Why ``project``'s ``max_devices`` holds back a job needing ``need`` more devices
    while the project's jobs hold ``held`` and jobs ahead of it in the queue were let in
    for ``promised`` more; empty when it does not."""
    limit = project.max_devices if project is not None else None
    if project is None or limit is None or held + promised + need <= limit:
        return ""
    ahead = f" and jobs ahead of it start on {promised} more" if promised else ""
    return (
        f"quota: project {project.name} holds {held}{ahead} of its {limit} device(s) "
        f"(max_devices); this job needs {need}"
    )


def apply_quotas(
    demands: Sequence[JobDemand],
    *,
    project_of: Mapping[str, str],
    projects: Mapping[str, ProjectRecord],
    held: Mapping[str, int],
) -> tuple[list[JobDemand], dict[str, str]]:
    """The demands the policy may place under each project's quotas, and why each job a
    quota holds back waits.

    ``max_devices``: the project's waiting jobs are let in, in queue order, while their
    ``min_devices`` fit beside what its jobs ``held``; the devices left over become the
    ceiling of each job's ``max_devices`` in turn (waiting jobs first), so whatever the
    policy decides the project never holds more than its quota. ``weight``: with jobs of
    more than one project, a job's priority becomes its project's weight times its share
    of the project's priorities, so the policies' weighted shares split the cluster
    between projects by weight, then between a project's jobs by priority.
    """
    left = {
        name: p.max_devices - held.get(name, 0)
        for name, p in projects.items()
        if p.max_devices is not None
    }
    held_back: dict[str, str] = {}
    for d in demands:
        project = project_of.get(d.name, "")
        if d.held or project not in left:
            continue
        if left[project] < d.min_devices:
            quota, now_held = projects[project], held.get(project, 0)
            promised = (quota.max_devices or 0) - now_held - left[project]
            held_back[d.name] = quota_reason(
                quota, held=now_held, need=d.min_devices, promised=promised
            )
            continue
        left[project] -= d.min_devices
    kept = [d for d in demands if d.name not in held_back]
    capped = {
        d.name: _capped(d, project_of.get(d.name, ""), left)
        for d in sorted(kept, key=lambda d: bool(d.held))  # the spare goes to waiting jobs first
    }
    return _weighted([capped[d.name] for d in kept], project_of, projects), held_back


def _capped(demand: JobDemand, project: str, left: dict[str, int]) -> JobDemand:
    """``demand`` with at most the devices its project has left (taken from ``left``)."""
    if project not in left:
        return demand
    base = len(demand.held) or demand.min_devices
    spare = max(0, left[project])
    ceiling = base + spare
    wanted = demand.max_devices if demand.max_devices is not None else math.inf
    new_max = max(demand.min_devices, int(min(wanted, ceiling)))
    left[project] = spare - max(0, new_max - base)
    return demand if new_max == demand.max_devices else replace(demand, max_devices=new_max)


def _weighted(
    demands: list[JobDemand], project_of: Mapping[str, str], projects: Mapping[str, ProjectRecord]
) -> list[JobDemand]:
    names = {project_of.get(d.name, "") for d in demands}
    if len(names) < 2:
        return demands  # one project: the policies see the priorities as they were
    totals: dict[str, float] = {}
    for d in demands:
        key = project_of.get(d.name, "")
        totals[key] = totals.get(key, 0.0) + d.priority
    out = []
    for d in demands:
        key = project_of.get(d.name, "")
        weight = projects[key].weight if key in projects else 1.0
        out.append(replace(d, priority=weight * d.priority / totals[key]))
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledJob:
    """One job in a round: what it holds, what the policy gave it, and why."""

    job_id: str
    name: str
    status: JobStatus
    held: tuple[str, ...]
    """Devices it runs on now (empty while it waits or moves)."""
    devices: tuple[str, ...]
    """Devices the round allocated it (pinned: the ones it named)."""
    samples_per_s: float
    """The policy's planned rate on ``devices`` (0 while it waits)."""
    reason: str
    priority: float
    waiting_s: float
    """Seconds since it was submitted, while it waits; 0 once it runs."""
    owner: str = ""
    project: str = ""

    @classmethod
    def of(
        cls,
        job: JobRecord,
        status: JobStatus,
        *,
        held: tuple[str, ...] = (),
        devices: tuple[str, ...] = (),
        rate: float = 0.0,
        reason: str,
    ) -> ScheduledJob:
        waiting = status == "waiting"
        return cls(
            job_id=job.id,
            name=job.name,
            status=status,
            held=held,
            devices=devices,
            samples_per_s=rate,
            reason=reason,
            priority=job.spec.priority,
            waiting_s=(datetime.now(UTC) - job.created_at).total_seconds() if waiting else 0.0,
            owner=job.owner,
            project=job.project,
        )


def running_row(record: JobRecord, live: LiveJob, allocation: Allocation | None) -> ScheduledJob:
    """A running job in the round: where it is, and where the policy moves it (if it does)."""
    held = tuple(live.devices)
    if live.pinned:
        why = pinned_reason(len(live.granted))
        return ScheduledJob.of(record, PINNED, held=held, devices=tuple(live.granted), reason=why)
    target = live.move_to if live.move_to is not None else live.granted
    reason = live.move_reason if live.move_to is not None else ""
    rate = 0.0
    if allocation is not None:
        reason = reason or allocation.reasons.get(live.job_id, "")
        rate = allocation.samples_per_s.get(live.job_id, 0.0)
    if not reason and not rate:  # no round has decided on it since: why it is there
        reason, rate = live.reason, live.rate
    status: JobStatus = "moving" if live.move.is_set() else "running"
    return ScheduledJob.of(
        record, status, held=held, devices=tuple(target), rate=rate, reason=reason
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """The latest round's decision, as ``GET /api/v1/schedule`` shows it."""

    policy: str
    round_s: float
    decided_at: datetime | None = None
    solver: str = ""
    rates: dict[str, str] = field(default_factory=dict)
    """Model -> ``measured`` or ``analytic``: where the policy's rates came from."""
    jobs: tuple[ScheduledJob, ...] = ()


@dataclass(kw_only=True, slots=True)
class Demands:
    """Turns job records into policy demands; one per executor, caching models and rates."""

    store: JobStore
    data_dir: Path
    rates: PlannedRates | None = None
    _models: dict[str, tuple[str, ModelPreset]] = field(default_factory=dict)
    _sources: dict[str, str] = field(default_factory=dict)
    _t0: float = field(default_factory=time.time)
    _restart_s: dict[str, float] = field(default_factory=dict)
    """Median recorded recovery time per job that has recovered at least once."""

    def rates_for(self, cluster: Cluster) -> PlannedRates:
        if self.rates is None:
            self.rates = PlannedRates.for_cluster(cluster)
        return self.rates

    def model_of(self, job: JobRecord) -> tuple[str, ModelPreset]:
        """The name the policy knows the job's model by, and the model (cached per job)."""
        known = self._models.get(job.id)
        if known is None:
            model = model_from_ref(job.spec.model, data_dir=self.data_dir)
            preset = isinstance(job.spec.model, str) and job.spec.model in PRESETS
            name = model.name if preset else model_key(model)
            known = (name, model)
            self._models[job.id] = known
        return known

    def demand(
        self, job: JobRecord, *, held: tuple[str, ...], steps_done: int, cluster: Cluster
    ) -> JobDemand:
        name, model = self.model_of(job)
        rates = self.rates_for(cluster)
        if name not in PRESETS:
            rates.models[name] = model
        created = job.created_at.timestamp()
        return JobDemand(
            name=job.id,
            model=name,
            global_batch=job.spec.global_batch,
            steps_left=max(0, job.spec.steps - steps_done),
            priority=job.spec.priority,
            min_devices=job.spec.min_devices,
            max_devices=job.spec.max_devices,
            restart_s=self.restart_s(job.id),
            held=held,
            arrival_s=created - self._t0,
            waiting_s=0.0 if held else max(0.0, time.time() - created),
        )

    def restart_s(self, job_id: str) -> float | None:
        """What moving the job costs, from the restarts the store recorded: the median
        ``recover_s`` of its own recoveries, else of every job's seen so far; ``None``
        (the policy's ``reallocation_s``) before any was recorded."""
        own = [
            float(e.data["recover_s"])
            for e in self.store.events(job_id)
            if e.kind == "recovery" and "recover_s" in e.data
        ]
        if own:
            self._restart_s[job_id] = statistics.median(own)
        if job_id in self._restart_s:
            return self._restart_s[job_id]
        return statistics.median(self._restart_s.values()) if self._restart_s else None

    def forget(self, job_id: str) -> None:
        self._models.pop(job_id, None)

    def source(self, name: str) -> str:
        return self._sources.get(name, "analytic")

    def use_measured(self, name: str, cluster: Cluster) -> bool:
        """Feed the rates a stored measurement of ``name`` that covers every device type.

        Returns whether the rates now use measured figures for it.
        """
        if self._sources.get(name) == "measured":
            return True
        profile = stored_profile(self.store, name, cluster)
        if profile is None:
            return False
        self.rates_for(cluster).set_measured(name, profile)
        self._sources[name] = "measured"
        return True


def stored_profile(store: JobStore, model: str, cluster: Cluster) -> Profile | None:
    """One measured device of each type of ``cluster`` for ``model``, newest first."""
    wanted = {d.type for d in cluster.devices}
    by_type: dict[str, DeviceProfile] = {}
    links = cluster.links
    gradient_bytes = 0
    for record in store.profiles():  # newest first
        if record.cluster != cluster.name or record.model != model or record.source == "analytic":
            continue
        try:
            profile = profile_from_dict(record.profile)
        except HetschedError:
            continue
        gradient_bytes = gradient_bytes or profile.gradient_bytes
        for device in profile.devices:
            by_type.setdefault(device.type, device)
        if wanted <= set(by_type):
            return Profile(
                model=model,
                devices=tuple(by_type[t] for t in sorted(wanted)),
                links=links,
                gradient_bytes=gradient_bytes,
                source="measured",
            )
    return None
