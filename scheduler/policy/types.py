"""What a scheduling policy reads and writes: job demands, settings, the allocation.

The policy (:mod:`scheduler.policy.decide`) is pure: the service's executor and the
cluster simulator both build :class:`JobDemand` values for every job that is
running or waiting, call :func:`scheduler.policy.decide.decide`, and apply the
:class:`Allocation` it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from scheduler.errors import HetschedError

PolicyName = Literal["fifo", "fair", "goodput"]
Objective = Literal["jct", "throughput"]
OBJECTIVES: tuple[Objective, ...] = ("jct", "throughput")
POLICIES: tuple[PolicyName, ...] = ("fifo", "fair", "goodput")
DEFAULT_POLICY: PolicyName = "goodput"


class PolicyError(HetschedError):
    """A scheduling request is invalid (unknown policy, bad job demand)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobDemand:
    """One job as the policy sees it, running or waiting."""

    name: str
    """Unique among the jobs of one decision."""
    model: str
    """Model preset (:data:`scheduler.models.presets.PRESETS`)."""
    global_batch: int
    steps_left: float
    """Training steps still to run (fractional in the simulator)."""
    priority: float = 1.0
    """Weight: ``fair`` gives a job rate in proportion to it, ``goodput`` values it so."""
    min_devices: int = 1
    """Fewer devices than this and the job waits."""
    max_devices: int | None = None
    """Never more devices than this; ``None``: as many as help (``fifo``: the whole cluster)."""
    device_types: tuple[str, ...] | None = None
    """Catalogue types the job may run on; ``None``: any."""
    restart_s: float | None = None
    """What moving this job costs (seconds without progress); ``None``: the settings'
    ``reallocation_s``."""
    held: tuple[str, ...] = ()
    """Device ids the job holds now (empty while it waits)."""
    arrival_s: float = 0.0
    """When it was submitted: ``fifo`` order and ties."""
    waiting_s: float = 0.0
    """Seconds it has been waiting without devices (aging); 0 while it runs."""

    def __post_init__(self) -> None:
        where = f"job {self.name!r}"
        if not self.name:
            raise PolicyError("job.name: must be a non-empty string")
        if self.global_batch < 1:
            raise PolicyError(f"{where}: global_batch must be >= 1, got {self.global_batch}")
        if not self.steps_left >= 0:
            raise PolicyError(f"{where}: steps_left must be >= 0, got {self.steps_left}")
        if not (self.priority > 0 and math.isfinite(self.priority)):
            raise PolicyError(f"{where}: priority must be a number > 0, got {self.priority}")
        if self.min_devices < 1:
            raise PolicyError(f"{where}: min_devices must be >= 1, got {self.min_devices}")
        if self.restart_s is not None and not (
            self.restart_s >= 0 and math.isfinite(self.restart_s)
        ):
            raise PolicyError(f"{where}: restart_s must be a number >= 0, got {self.restart_s}")
        if self.max_devices is not None and self.max_devices < self.min_devices:
            raise PolicyError(
                f"{where}: max_devices {self.max_devices} is below min_devices {self.min_devices}"
            )

    @property
    def running(self) -> bool:
        return bool(self.held)

    @property
    def samples_left(self) -> float:
        return self.steps_left * self.global_batch


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicySettings:
    """Knobs of the ``fair`` and ``goodput`` policies (``fifo`` has none)."""

    objective: Objective = "jct"
    """``goodput``'s objective. ``jct`` (default): least average job completion time --
    an allocation is worth the share of the job's remaining work it does per second
    (rate / remaining samples, Smith's rule in rate form), so jobs with the least
    remaining time are served first and a waiting job may keep waiting while shorter
    ones run; ``max_wait_s`` and ``aging_s`` bound how long. ``throughput``: the total
    normalised rate (Gavel's and Sia's throughput form), every admitted job running."""
    fairness_floor: float = 0.5
    """``goodput``: every running job keeps at least this share of the max-min level of
    normalised rate that ``fair``'s water-filling reaches on the same jobs."""
    reallocation_s: float = 60.0
    """What moving a running job costs: checkpoint, restart, re-plan (seconds of no progress)."""
    move_penalty: float = 0.05
    """Extra share of value a move must win, so near-ties do not make jobs thrash."""
    srpt_power: float = 0.25
    """``jct``: an allocation is worth its normalised rate times (remaining time on an
    equal share) to the power ``-srpt_power``. 1 is the rate at which the job's
    remaining work gets done (shortest-remaining-time-first's greedy rule); 0 is
    ``throughput``'s value. Chosen on generated traces (seed 2: hetero-64 at 8/h with
    the small request mix and at 16/h with the large one) and Gavel's public trace,
    average JCT against ``fair``: 1 gave 13 % lower at 16/h with p99 24 % worse and
    makespan 28 % longer (short jobs spread wide while long ones starved); 0.5 gave
    19 % (p99 4 % worse) and 18 % on Gavel's (p99 5 % worse); 0.25 gave 19 % (p99 1 %
    better), 16 % on Gavel's (p99 within fair's own run-to-run spread) and 7 % at
    8/h, where ``throughput`` gave 5 % (issue 20). Checked afterwards, not tuned on:
    Sia's traces and the seed-1 sweep of tests/benchmarks/test_policy_sweep.py."""
    move_horizon_s: float = 3600.0
    """``jct``: a move pays its restart out of at most this many seconds on the new
    devices (allocations change as jobs come and go, so a restart is not amortised
    over all of a long job's remaining time)."""
    aging_s: float = 3600.0
    """A waiting job's urgency grows by its priority once per ``aging_s`` waited."""
    max_wait_s: float = 4 * 3600.0
    """A job that has waited this long, or as long as it takes to run on an equal share
    when that is longer, goes first, and no smaller job is slipped past it. The second
    bound (bounded slowdown: Feitelson et al., "Theory and practice in parallel job
    scheduling", JSSPP 1997) keeps a queue of jobs that each run for days from turning
    first-come-first-served once all have waited 4 h: on Gavel's microbenchmark trace
    (100 one-GPU jobs of up to 300 h) ``goodput`` had a 4 % higher average JCT than
    ``fifo``, and has 16 % lower with it."""
    size_cap_share: float = 4.0
    """Candidate allocations reach at most this many equal shares (and at least min_devices)."""
    min_gain: float = 0.01
    """A larger candidate must add at least this share of rate, or it is not offered."""
    solver_node_limit: int = 200
    """HiGHS branch-and-bound nodes per decision; past it the best allocation found is used."""
    solver_time_limit_s: float = 0.5
    """HiGHS wall-clock limit per decision; past it the best allocation found is used.
    On a busy machine it can bind at a different point, so a replay under ``fair``
    (whose program rarely closes its gap in time at scale) may differ between runs."""

    def __post_init__(self) -> None:
        for name in (
            "reallocation_s",
            "move_penalty",
            "srpt_power",
            "move_horizon_s",
            "aging_s",
            "max_wait_s",
            "min_gain",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise PolicyError(f"settings.{name}: must be a number >= 0, got {value}")
        if self.objective not in OBJECTIVES:
            raise PolicyError(
                f"settings.objective: unknown {self.objective!r}; allowed: {', '.join(OBJECTIVES)}"
            )
        if not 0 <= self.fairness_floor <= 1:
            raise PolicyError(
                f"settings.fairness_floor: must be in [0, 1], got {self.fairness_floor}"
            )
        if not self.size_cap_share >= 1:
            raise PolicyError(f"settings.size_cap_share: must be >= 1, got {self.size_cap_share}")
        if not self.solver_time_limit_s > 0:
            raise PolicyError(
                f"settings.solver_time_limit_s: must be > 0, got {self.solver_time_limit_s}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocation:
    """One decision: which devices every job holds, how fast it goes, and why."""

    policy: PolicyName
    devices: dict[str, tuple[str, ...]]
    """Job name -> device ids; ``()`` for a job that waits."""
    samples_per_s: dict[str, float]
    """Job name -> planned samples/s on those devices (0 while it waits)."""
    reasons: dict[str, str]
    """Job name -> one line: why it got these devices, or why it waits."""
    solver: str
    """How the decision was made: what was exact and what heuristic."""
