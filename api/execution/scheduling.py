"""What the executor hands the scheduling policy, and what it keeps of its decisions.

A job record becomes a :class:`~scheduler.policy.types.JobDemand`; the rates come from
one :class:`~scheduler.policy.rates.PlannedRates` per cluster, measured where the
store has profiles (:class:`Demands`); each round leaves a :class:`Schedule`, which
``GET /api/v1/schedule`` shows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

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
