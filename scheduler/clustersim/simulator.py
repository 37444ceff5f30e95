"""Replay a job trace on a cluster under a scheduling policy, from the cost model alone.

Event-driven, no training: hours of cluster time in seconds of CPU (the replay
in :func:`simulate`). Reported per policy (:class:`SimResult`): each job's
arrival, start, end and allocation history, job completion times (JCT, end −
arrival), the makespan, utilisation and the slowest decision.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scheduler.clustersim.trace import TraceJob
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster
from scheduler.policy.configs import ClusterClasses, single_rates
from scheduler.policy.decide import decide
from scheduler.policy.rates import PlannedRates, job_rate
from scheduler.policy.types import JobDemand, PolicyName, PolicySettings

DONE_TOLERANCE = 1e-9
REPLAY_SOLVER_TIME_LIMIT_S = 5.0
"""A replay's HiGHS limit per decision, ten times the service's
(:attr:`PolicySettings.solver_time_limit_s`): a search then stops at its node limit, not
at a time that depends on the machine, so a replay gives the same JCTs on a busy laptop
as on an idle server while its searches take under 5 s there (the policy sweep's
slowest, ``fair`` at 16 jobs/h on the Gavel cluster, takes 1.5 s on an idle 2-core
machine). With the service's 0.5 s binding (as under heavy load), ``fair`` on Gavel's
trace read 2.58 h of average JCT against 2.31 h. At 2,000 GPUs × 200 jobs ``fair``'s
program then closes its gap (3.9 s) where the service stops at its best found."""


def replay_policy(**changes: Any) -> PolicySettings:
    """The policy settings a replay decides with: the service's, but for the solver's
    time limit (:data:`REPLAY_SOLVER_TIME_LIMIT_S`); ``changes`` set other fields."""
    return PolicySettings(solver_time_limit_s=REPLAY_SOLVER_TIME_LIMIT_S, **changes)


class SimulationError(HetschedError):
    """A trace cannot be replayed on a cluster (a job can never run there)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimSettings:
    round_s: float = 300.0
    """Seconds between scheduling rounds (besides arrivals and completions)."""
    reallocation_s: float = 60.0
    """Checkpoint + restart time charged when a running job's devices change."""
    policy: PolicySettings = field(default_factory=replay_policy)

    def __post_init__(self) -> None:
        if not (self.round_s > 0 and math.isfinite(self.round_s)):
            raise SimulationError(f"round_s: must be a number > 0, got {self.round_s}")
        if not (self.reallocation_s >= 0 and math.isfinite(self.reallocation_s)):
            raise SimulationError(
                f"reallocation_s: must be a number >= 0, got {self.reallocation_s}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocationRecord:
    t_s: float
    """When the allocation was decided."""
    devices: tuple[str, ...]
    samples_per_s: float
    resume_s: float
    """When progress starts on it (``t_s`` plus any re-allocation delay)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobResult:
    """One replayed job: when it arrived, started and ended, and every allocation it held."""

    name: str
    arrival_s: float
    start_s: float
    end_s: float
    allocations: tuple[AllocationRecord, ...]

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arrival_s": self.arrival_s,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "jct_s": self.jct_s,
            "allocations": [
                {
                    "t_s": a.t_s,
                    "devices": list(a.devices),
                    "samples_per_s": a.samples_per_s,
                    "resume_s": a.resume_s,
                }
                for a in self.allocations
            ],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class SimResult:
    """One policy's replay of a trace: every job's outcome and the cluster's totals."""

    policy: PolicyName
    jobs: tuple[JobResult, ...]
    makespan_s: float
    utilization: float
    decision_s_max: float
    num_decisions: int
    num_reallocations: int

    @property
    def jcts_s(self) -> list[float]:
        return [j.jct_s for j in self.jobs]

    @property
    def avg_jct_s(self) -> float:
        return statistics.fmean(self.jcts_s)

    @property
    def p50_jct_s(self) -> float:
        return percentile(self.jcts_s, 50)

    @property
    def p99_jct_s(self) -> float:
        return percentile(self.jcts_s, 99)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "avg_jct_s": self.avg_jct_s,
            "p50_jct_s": self.p50_jct_s,
            "p99_jct_s": self.p99_jct_s,
            "makespan_s": self.makespan_s,
            "utilization": self.utilization,
            "decision_s_max": self.decision_s_max,
            "num_decisions": self.num_decisions,
            "num_reallocations": self.num_reallocations,
            "jobs": [j.to_dict() for j in self.jobs],
        }


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(kw_only=True, slots=True)
class _Live:
    """A job's mutable state during one replay."""

    job: TraceJob
    done_samples: float = 0.0
    devices: tuple[str, ...] = ()
    rate: float = 0.0
    resume_s: float = 0.0
    start_s: float | None = None
    waiting_since_s: float = 0.0
    records: list[AllocationRecord] = field(default_factory=list)

    @property
    def total_samples(self) -> float:
        return float(self.job.steps * self.job.global_batch)

    def finish_s(self, now_s: float) -> float:
        if not self.devices or self.rate <= 0:
            return math.inf
        left = max(0.0, self.total_samples - self.done_samples)
        return max(now_s, self.resume_s) + left / self.rate

    def advance(self, from_s: float, to_s: float) -> None:
        if self.devices and self.rate > 0:
            self.done_samples += self.rate * max(0.0, to_s - max(from_s, self.resume_s))

    def demand(self, now_s: float) -> JobDemand:
        job = self.job
        return JobDemand(
            name=job.name,
            model=job.model,
            global_batch=job.global_batch,
            steps_left=max(0.0, self.total_samples - self.done_samples) / job.global_batch,
            priority=job.priority,
            min_devices=job.min_devices,
            max_devices=job.max_devices,
            device_types=job.device_types,
            restart_s=job.restart_s,
            held=self.devices,
            arrival_s=job.arrival_s,
            waiting_s=0.0 if self.devices else now_s - self.waiting_since_s,
        )


MAX_ROUNDS = 200_000
"""Scheduling rounds a replay may need at least (2 years of cluster time at the default
``round_s``); a trace beyond it is refused up front rather than replayed for hours."""


def check_runnable(
    cluster: Cluster, trace: list[TraceJob], rates: PlannedRates, *, round_s: float | None = None
) -> None:
    """Raise :class:`SimulationError` naming the first job that can never run on ``cluster``,
    or, given ``round_s``, that would keep a replay deciding for more than
    :data:`MAX_ROUNDS` rounds."""
    classes = ClusterClasses.of(cluster)
    for job in trace:
        rate = job_rate(rates, model=job.model, global_batch=job.global_batch)
        allowed = [c for c in classes.ids if job.device_types is None or c.type in job.device_types]
        if not allowed:
            present = sorted({c.type for c in classes.ids})
            raise SimulationError(
                f"trace job {job.name!r}: device_types {'|'.join(job.device_types or ())}: "
                f"{cluster.name} has none; it has {', '.join(present)}"
            )
        fits = single_rates(classes, allowed, rate)
        usable = sum(classes.capacity(c) for c in fits)
        if not fits:
            types = "" if job.device_types is None else f" of type {'|'.join(job.device_types)}"
            raise SimulationError(
                f"trace job {job.name!r}: model {job.model} fits no device{types} of "
                f"{cluster.name} (a replay runs each job data-parallel, its whole model states "
                "on every device; `hetsched plan` also tries fsdp and pipelines)"
            )
        if usable < job.min_devices:
            raise SimulationError(
                f"trace job {job.name!r}: min_devices {job.min_devices} but only {usable} devices "
                f"of cluster {cluster.name} can hold {job.model}"
            )
        if round_s is not None:
            # No allocation beats every device that holds the model, each at its solo rate.
            fastest_s = (
                job.steps * job.global_batch / sum(classes.capacity(c) * r for c, r in fits.items())
            )
            if (job.arrival_s + fastest_s) / round_s > MAX_ROUNDS:
                raise SimulationError(
                    f"trace job {job.name!r}: steps {job.steps:,} take at least "
                    f"{fastest_s / 86400:,.0f} days even on all {usable} devices that hold "
                    f"{job.model}, over {MAX_ROUNDS:,} scheduling rounds of {round_s:g} s: "
                    "lower its steps or raise --round-s"
                )


def simulate(
    cluster: Cluster,
    trace: list[TraceJob],
    *,
    policy: PolicyName,
    settings: SimSettings | None = None,
    rates: PlannedRates | None = None,
) -> SimResult:
    """Replay ``trace`` on ``cluster`` under ``policy``.

    Events are
    arrivals, completions and a round every ``round_s``; at each one the policy
    (:func:`scheduler.policy.decide.decide`) re-decides every job's devices. Between
    events a job progresses at its allocation's planned rate (samples/s from the
    data-parallel planner, so steps/s = samples/s / global_batch). Changing the
    devices of a job that already made progress (move, grow, shrink, resume after
    preemption) costs the job's ``restart_s`` (else ``reallocation_s``) without
    progress: checkpoint, restart on the new devices, restore (DESIGN.md, "A job's
    life"); a job's first start is free.
    """
    settings = settings or SimSettings()
    rates = rates or PlannedRates.for_cluster(cluster)
    check_runnable(cluster, trace, rates, round_s=settings.round_s)
    replay = _Replay(cluster=cluster, trace=trace, policy=policy, settings=settings, rates=rates)
    while replay.arrivals or replay.active:
        changed = replay.retire_finished()
        changed = replay.admit_arrivals() or changed
        changed = replay.round_due() or changed
        if changed and replay.active:
            replay.decide()
        if not replay.advance():
            break
    return replay.result()


class _Replay:
    """One policy's replay in progress: the clock, the jobs waiting to arrive, the
    active ones, and the totals the result reports."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        trace: list[TraceJob],
        policy: PolicyName,
        settings: SimSettings,
        rates: PlannedRates,
    ) -> None:
        self.cluster, self.trace, self.policy = cluster, trace, policy
        self.settings, self.rates = settings, rates
        self.arrivals = deque(sorted(trace, key=lambda j: j.arrival_s))
        self.active: dict[str, _Live] = {}
        self.results: list[JobResult] = []
        self.now_s = self.arrivals[0].arrival_s if self.arrivals else 0.0
        self.next_round_s = self.now_s + settings.round_s
        self.held_device_s = 0.0
        self.decision_s_max = 0.0
        self.num_decisions = 0
        self.num_moves = 0

    def retire_finished(self) -> bool:
        """Move the jobs that have done all their samples to the results."""
        done = [
            n
            for n, live in self.active.items()
            if live.done_samples >= live.total_samples * (1 - DONE_TOLERANCE)
        ]
        for name in done:
            self.results.append(_result(self.active.pop(name), self.now_s))
        return bool(done)

    def admit_arrivals(self) -> bool:
        """Make the jobs that have arrived by now active."""
        admitted = False
        while self.arrivals and self.arrivals[0].arrival_s <= self.now_s:
            job = self.arrivals.popleft()
            self.active[job.name] = _Live(job=job, waiting_since_s=job.arrival_s)
            admitted = True
        return admitted

    def round_due(self) -> bool:
        """Whether a scheduling round is due and has something to decide: a job
        waiting, or a policy other than ``fifo`` (which never moves running jobs)."""
        if self.now_s < self.next_round_s:
            return False
        round_s = self.settings.round_s
        self.next_round_s += round_s * math.floor((self.now_s - self.next_round_s) / round_s + 1)
        return any(not live.devices for live in self.active.values()) or self.policy != "fifo"

    def decide(self) -> None:
        """Ask the policy for every active job's devices and apply its answer."""
        started = time.perf_counter()
        allocation = decide(
            self.cluster,
            [live.demand(self.now_s) for live in self.active.values()],
            policy=self.policy,
            rates=self.rates,
            settings=self.settings.policy,
        )
        self.decision_s_max = max(self.decision_s_max, time.perf_counter() - started)
        self.num_decisions += 1
        for name, live in self.active.items():
            self.num_moves += _apply(
                live,
                allocation.devices[name],
                allocation.samples_per_s[name],
                self.now_s,
                self.settings,
            )
        if not self.arrivals and not any(live.devices for live in self.active.values()):
            stuck = "; ".join(f"{n}: {allocation.reasons[n]}" for n in list(self.active)[:3])
            raise SimulationError(f"jobs can never start under {self.policy}: {stuck}")

    def advance(self) -> bool:
        """Progress every job to the next event; False when there is none."""
        next_s = min(
            self.arrivals[0].arrival_s if self.arrivals else math.inf,
            self.next_round_s if self.active else math.inf,
            *(live.finish_s(self.now_s) for live in self.active.values()),
        )
        if not math.isfinite(next_s):
            return False
        for live in self.active.values():
            live.advance(self.now_s, next_s)
            self.held_device_s += len(live.devices) * (next_s - self.now_s)
        self.now_s = next_s
        return True

    def result(self) -> SimResult:
        first = min((j.arrival_s for j in self.trace), default=0.0)
        makespan_s = max((r.end_s for r in self.results), default=first) - first
        num_devices = len(self.cluster.devices)
        utilization = self.held_device_s / (num_devices * makespan_s) if makespan_s > 0 else 0.0
        return SimResult(
            policy=self.policy,
            jobs=tuple(sorted(self.results, key=lambda r: (r.arrival_s, r.name))),
            makespan_s=makespan_s,
            utilization=utilization,
            decision_s_max=self.decision_s_max,
            num_decisions=self.num_decisions,
            num_reallocations=self.num_moves,
        )


def _apply(
    live: _Live, devices: tuple[str, ...], rate: float, now_s: float, settings: SimSettings
) -> int:
    """Give ``live`` its new devices; 1 when that was a re-allocation, else 0."""
    if set(devices) == set(live.devices):
        live.rate = rate
        return 0
    moved = bool(live.done_samples > 0 or live.devices)
    if not devices:
        live.waiting_since_s = now_s
    if live.start_s is None and devices:
        live.start_s = now_s
    live.devices = devices
    live.rate = rate
    restart_s = settings.reallocation_s if live.job.restart_s is None else live.job.restart_s
    live.resume_s = now_s + (restart_s if moved and devices else 0.0)
    live.records.append(
        AllocationRecord(t_s=now_s, devices=devices, samples_per_s=rate, resume_s=live.resume_s)
    )
    return 1 if moved else 0


def _result(live: _Live, end_s: float) -> JobResult:
    return JobResult(
        name=live.job.name,
        arrival_s=live.job.arrival_s,
        start_s=live.start_s if live.start_s is not None else end_s,
        end_s=end_s,
        allocations=tuple(live.records),
    )
