"""Where each policy wins: a sweep over load, job-size mix and cluster mix, and public traces.

Traces: generated ones (:func:`~scheduler.clustersim.trace.generate_trace`, ``NUM_JOBS``
jobs) at ``LOADS`` jobs per hour, with the default request mix (mostly one GPU) and
:data:`~scheduler.clustersim.trace.LARGE_REQUEST_MIX` (mostly 8-16 GPUs), on two
clusters: Sia's 64-GPU T4/RTX 2080 Ti/A100 shape (``deploy/clusters/hetero-64.yaml``)
and a 48-GPU cluster of three generations (Gavel's physical cluster shape, V100/P100/K80,
``deploy/traces/public/gavel-physical-48.yaml``); and the public excerpts of
``deploy/traces/public`` (Gavel's physical-cluster, microbenchmark and MSR traces on the
Gavel cluster, Sia's Philly, Helios-Saturn and newTrace workloads on the Sia cluster),
converted by :mod:`scheduler.clustersim.imports`.

Printed per trace and policy: average and p99 JCT, makespan, moves per job; then, per
trace, the default policy's average JCT against ``fair``'s and whether its p99 is no
worse (issue 20's target: at least 15 % below ``fair`` on average JCT and not worse at
p99 on each trace), and a summary of which policy wins where. Beside them, two lower
bounds on each trace's average JCT (:mod:`scheduler.clustersim.bound`): every job alone
on the cluster on its fastest candidate allocation from its arrival, and a linear program
that keeps the cluster's capacity per device class in every time slot (on a cluster whose
fast GPUs are few it is the much higher one). No policy that chooses among those
allocations does better than the second, so where it is less than 15 % below ``fair``'s
figure the target cannot be met on that trace by any policy, and the summary says so.
Above them, the best schedule :mod:`scheduler.clustersim.offline` finds knowing the
whole trace in advance, paying for its restarts as the replays do (a policy cannot avoid
them; the one found with restarts free is printed beside it): the best possible average
lies between it and the bound, and where even it is less than 15 % below ``fair``'s, an
online policy is not expected to get there either (the summary says so: the search is
not exhaustive). That schedule often fails the target's other half (it runs the longest
jobs last), so the search runs again under a p99 cap at ``fair``'s: a trace is a miss of
the policy only where some schedule found meets both halves.
Asserted: every job finishes under every policy, none beats either bound, the schedule
found does not either, and ``goodput`` never has a higher average JCT than ``fifo``.
Decision time at 2,000 GPUs × 200 jobs is
``tests/benchmarks/test_cluster_sim.py::test_decision_speed_2000_gpus_200_jobs``.

Run on purpose (minutes):

    .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_policy_sweep.py
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from scheduler.clustersim.bound import alone_avg_jct_s, shared_avg_jct_s
from scheduler.clustersim.imports import TraceFormat, load_any
from scheduler.clustersim.offline import FoundSchedules, best_found_schedules, within_p99
from scheduler.clustersim.simulator import SimResult, SimSettings, simulate
from scheduler.clustersim.trace import LARGE_REQUEST_MIX, TraceJob, generate_trace
from scheduler.hardware.cluster import Cluster, load_cluster
from scheduler.policy.configs import ClusterClasses, single_rates
from scheduler.policy.rates import PlannedRates, job_rate
from scheduler.policy.types import DEFAULT_POLICY, POLICIES

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT / "deploy" / "traces" / "public"
NUM_JOBS = 60
LOADS = (4.0, 8.0, 16.0)
MIXES: dict[str, dict[int, float] | None] = {"small": None, "large": LARGE_REQUEST_MIX}
SIA = ROOT / "deploy" / "clusters" / "hetero-64.yaml"
GAVEL = PUBLIC / "gavel-physical-48.yaml"
IMPORTED: list[tuple[str, TraceFormat, Path]] = [
    ("gavel-max-min-fairness.trace", "gavel", GAVEL),
    ("gavel-microbenchmark-arrival-rate-1.trace", "gavel", GAVEL),
    ("gavel-msr-seed0-51b7ef.trace", "gavel", GAVEL),
    ("sia-philly-workload-1.csv", "sia", SIA),
    ("sia-helios-saturn-workload-1.csv", "sia", SIA),
    ("sia-newtrace-workload-1.csv", "sia", SIA),
]


GPT2 = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")


def fitted(trace: list[TraceJob], cluster: Cluster, rates: PlannedRates) -> list[TraceJob]:
    """``trace`` with each job whose model fits no GPU of ``cluster`` (a ``gpt2-xl`` on
    V100-16GB/P100/K80) given the largest smaller preset that does, same batch and steps."""
    classes = ClusterClasses.of(cluster)
    out = []
    for job in trace:
        smaller = GPT2[: GPT2.index(job.model) + 1] if job.model in GPT2 else (job.model,)
        for model in reversed(smaller):
            rate = job_rate(rates, model=model, global_batch=job.global_batch)
            if single_rates(classes, classes.ids, rate):
                out.append(replace(job, model=model))
                break
        else:
            out.append(job)
    return out


def cases() -> list[tuple[str, Path, TraceFormat | None, float, str]]:
    """(label, cluster spec, import format or None for generated, load, mix)."""
    out: list[tuple[str, Path, TraceFormat | None, float, str]] = []
    for path, short in ((SIA, "sia-64"), (GAVEL, "gavel-48")):
        for load in LOADS:
            for mix in MIXES:
                out.append((f"{short} {load:g}/h {mix}", path, None, load, mix))
    for name, fmt, path in IMPORTED:
        out.append((name, path, fmt, 0.0, ""))
    return out


TARGET = 0.15
"""Issue 20: the default policy's average JCT at least this far below ``fair``'s."""


REALLOCATION_S = SimSettings().reallocation_s
"""What the replays charge a restart (a job's own ``restart_s`` where the trace has one);
the schedules found pay it too (:mod:`scheduler.clustersim.offline`)."""


def found_schedules(
    trace: list[TraceJob], cluster: Cluster, rates: PlannedRates, fair: SimResult
) -> FoundSchedules:
    """The best schedules found knowing the trace, the capped one under ``fair``'s p99."""
    return best_found_schedules(
        trace, cluster, rates, reallocation_s=REALLOCATION_S, p99_cap_s=fair.p99_jct_s
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    gain: float
    """1 - goodput's average JCT / fair's."""
    reachable: float
    """1 - the bound / fair's average JCT: the most any policy could gain."""
    found_free: float
    """1 - the best schedule found with restarts free / fair's average JCT."""
    found: float
    """1 - the best schedule found paying for restarts / fair's average JCT: what a
    clairvoyant schedule that pays what the policy pays gains."""
    found_both: float | None
    """The same for the best schedule found (paying for restarts) whose p99 is no worse
    than fair's; None where the search found none."""
    p99_ratio: float
    makespan_ratio: float

    @classmethod
    def of(
        cls,
        default: SimResult,
        fair: SimResult,
        *,
        bound_s: float,
        found: FoundSchedules,
    ) -> Outcome:
        """The default policy's replay against ``fair``'s, the bound and the schedules found
        (:func:`found_schedules`)."""
        return cls(
            gain=1 - default.avg_jct_s / fair.avg_jct_s,
            reachable=1 - bound_s / fair.avg_jct_s,
            found_free=1 - found.free.avg_jct_s / fair.avg_jct_s,
            found=1 - found.charged.avg_jct_s / fair.avg_jct_s,
            found_both=(
                1 - found.capped.avg_jct_s / fair.avg_jct_s
                if within_p99(found.capped.p99_jct_s, fair.p99_jct_s)
                else None
            ),
            p99_ratio=default.p99_jct_s / fair.p99_jct_s,
            makespan_ratio=default.makespan_s / fair.makespan_s,
        )

    @property
    def found_both_text(self) -> str:
        return "none" if self.found_both is None else f"{self.found_both:+.1%}"

    @property
    def verdict(self) -> str:
        """``beyond found``: no schedule the search found, paying for restarts as the policy
        does, meets both halves of the target (the one with the lowest average often fails
        the p99 half: it runs the longest jobs last), so an online policy is not expected
        to either."""
        if self.gain >= TARGET and within_p99(self.p99_ratio, 1.0):
            return "meets"
        if self.reachable < TARGET:
            return "out of reach"
        if self.found_both is None or self.found_both < TARGET:
            return "beyond found"
        return "MISSES"


RESULTS: dict[str, dict[str, SimResult]] = {}
BOUND_S: dict[str, float] = {}
"""Per trace, the shared-capacity lower bound on average JCT (never below the other)."""
FOUND: dict[str, FoundSchedules] = {}
"""Per trace, the best clairvoyant schedules found (:func:`found_schedules`)."""


def _h(seconds: float) -> str:
    return f"{seconds / 3600:7.2f}"


@pytest.mark.benchmark
@pytest.mark.parametrize("case", cases(), ids=[c[0] for c in cases()])
def test_policies_on(case: tuple[str, Path, TraceFormat | None, float, str]) -> None:
    label, path, fmt, load, mix = case
    cluster = load_cluster(path)
    rates = PlannedRates.for_cluster(cluster)
    if fmt is None:
        trace = generate_trace(NUM_JOBS, jobs_per_hour=load, seed=1, request_mix=MIXES[mix])
        trace = fitted(trace, cluster, rates)
    else:
        trace = load_any(PUBLIC / label, fmt)
    results = {p: simulate(cluster, trace, policy=p, rates=rates) for p in POLICIES}
    alone = alone_avg_jct_s(trace, cluster, rates)
    # The bound holds for any horizon; the replays' latest end makes it tight.
    horizon_s = max(r.makespan_s for r in results.values()) + min(j.arrival_s for j in trace)
    shared = shared_avg_jct_s(trace, cluster, rates, horizon_s=horizon_s)
    BOUND_S[label] = shared
    found = found_schedules(trace, cluster, rates, results["fair"])
    assert min(s.avg_jct_s for s in (found.free, found.charged, found.capped)) >= shared * 0.999
    FOUND[label] = found
    print(
        f"\n{label:34s} bounds   avg {_h(alone)} h each job alone on its best allocation, "
        f"{_h(shared)} h sharing the cluster"
    )
    schedules = [
        (found.free, "the best schedule found knowing the trace, restarts free"),
        (found.charged, "the same paying for restarts as the replays do"),
    ]
    if found.capped is not found.charged:
        schedules.append(
            (found.capped, "the best found paying for restarts with p99 no worse than fair's")
        )
    for schedule, what in schedules:
        print(
            f"{label:34s} found    avg {_h(schedule.avg_jct_s)} h  p99 "
            f"{_h(schedule.p99_jct_s)} h {what}"
        )
    for policy, result in results.items():
        assert len(result.jobs) == len(trace), (label, policy)
        # No replay beats a lower bound (each without restart costs).
        assert result.avg_jct_s >= BOUND_S[label] * 0.999, (label, policy)
        print(
            f"{label:34s} {policy:8s} avg {_h(result.avg_jct_s)} h  p99 "
            f"{_h(result.p99_jct_s)} h  makespan {_h(result.makespan_s)} h  "
            f"moves/job {result.num_reallocations / len(trace):5.2f}  "
            f"slowest decision {result.decision_s_max * 1e3:5.0f} ms"
        )
    RESULTS[label] = results
    assert results["goodput"].avg_jct_s <= results["fifo"].avg_jct_s * 1.001, label


@pytest.mark.benchmark
def test_summary_of_where_each_policy_wins() -> None:
    if not RESULTS:
        pytest.skip("run with the sweep's cases")
    wins: dict[str, list[str]] = {p: [] for p in POLICIES}
    print(f"\n{DEFAULT_POLICY} vs fair per trace (target: >= 15% lower avg JCT, p99 not worse;")
    print("bound: the most any policy could gain on fair's average, from the shared bound;")
    print("found: what the best schedule found knowing the trace and paying for restarts")
    print("gains (free: with restarts free); with p99: the same for the best found whose")
    print("p99 is no worse than fair's):")
    for label, results in RESULTS.items():
        wins[min(results, key=lambda p: results[p].avg_jct_s)].append(label)
        default, fair = results[DEFAULT_POLICY], results["fair"]
        outcome = Outcome.of(default, fair, bound_s=BOUND_S[label], found=FOUND[label])
        print(
            f"  {label:34s} avg JCT {outcome.gain:+6.1%} (bound {outcome.reachable:+6.1%}, "
            f"found {outcome.found:+6.1%}, free {outcome.found_free:+6.1%}, "
            f"with p99 {outcome.found_both_text}), "
            f"p99 {outcome.p99_ratio - 1:+6.1%}: {outcome.verdict}"
        )
    print("lowest average JCT:")
    for policy, labels in wins.items():
        print(f"  {policy:8s} {len(labels):2d} traces: {', '.join(labels) or '-'}")
