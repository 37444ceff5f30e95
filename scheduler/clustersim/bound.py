"""Lower bounds on a trace's average JCT: what no policy can beat on a cluster.

Two bounds, both over the configurations the policies choose among
(:func:`~scheduler.policy.configs.candidates` within each job's device bounds, batch
and types), both without restart costs:

- :func:`alone_avg_jct_s`: every job alone on the cluster from its arrival, on its
  fastest configuration. It ignores that jobs share the cluster, so on a cluster whose
  fast devices are few it is far below what any schedule reaches.
- :func:`shared_avg_jct_s`: a time-indexed linear program that keeps the cluster's
  capacity per device class in every time slot (time-indexed relaxations as in Hall,
  Schulz, Shmoys and Wein, Math. Oper. Res. 1997), with completion times bounded through
  mean busy times (Goemans, Queyranne, Schulz, Skutella and Wang, SIAM J. Discrete Math.
  2002): a job whose work is done at a rate of at most its fastest configuration's
  finishes no earlier than its mean busy time plus half its fastest run time, and no
  earlier than the time it spends running after its arrival (at least its fastest run
  time; a job kept on slow devices runs longer), so the program's optimum is below
  every schedule's average JCT and never below the first bound. Time is cut into slots,
  a job's work in a slot is charged at the slot's start, and work after the horizon at
  the horizon, which keeps the bound valid for any horizon and slot length (a longer
  horizon and shorter slots tighten it).

The sweep (tests/benchmarks/test_policy_sweep.py) and ``hetsched cluster-sim --bound``
report both: the second is the most any policy could gain. Beside them they report the
best schedule :mod:`scheduler.clustersim.offline` finds: a real one, so the optimum lies
between it and the second bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import linprog  # type: ignore[import-untyped]
from scipy.sparse import coo_array  # type: ignore[import-untyped]

from scheduler.clustersim.trace import TraceJob
from scheduler.hardware.cluster import Cluster
from scheduler.policy.configs import ClusterClasses, candidates, single_rates
from scheduler.policy.rates import Config, PlannedRates, job_rate

DEFAULT_SLOTS = 400
"""Time slots of :func:`shared_avg_jct_s`: the bound is loose by at most one slot per job."""


def job_configs(
    classes: ClusterClasses, job: TraceJob, rates: PlannedRates
) -> list[tuple[Config, float]]:
    """The configurations a policy may give ``job``, each with its rate (samples/s)."""
    rate = job_rate(rates, model=job.model, global_batch=job.global_batch)
    types = None if job.device_types is None else {t.lower() for t in job.device_types}
    allowed = [c for c in classes.ids if types is None or c.type.lower() in types]
    singles = single_rates(classes, allowed, rate)
    hi = min(job.max_devices or classes.num_devices, job.global_batch)
    configs = candidates(
        classes=classes, singles=singles, lo=job.min_devices, hi=hi, rate=rate, min_gain=0.0
    )
    return [(c, r) for c in configs if (r := rate(c)) > 0]


def alone_avg_jct_s(trace: Sequence[TraceJob], cluster: Cluster, rates: PlannedRates) -> float:
    """Average JCT if every job ran alone from its arrival on its fastest configuration."""
    classes = ClusterClasses.of(cluster)
    total_s = 0.0
    for job in trace:
        fastest = max(r for _, r in job_configs(classes, job, rates))
        total_s += job.steps * job.global_batch / fastest
    return total_s / len(trace)


def shared_avg_jct_s(
    trace: Sequence[TraceJob],
    cluster: Cluster,
    rates: PlannedRates,
    *,
    horizon_s: float,
    slots: int = DEFAULT_SLOTS,
) -> float:
    """A lower bound on the average JCT of any schedule of ``trace`` on ``cluster``, never
    below :func:`alone_avg_jct_s`.

    Variables ``x[j,c,k] ≥ 0``: the share of slot ``k`` in which job ``j`` runs
    configuration ``c`` (from its arrival on); ``y[j] ≥ 0``: the share of its work done
    after ``horizon_s``; ``z[j]``: its JCT. Constraints: a job runs at most one
    configuration at a time (``Σ_c x[j,c,k] ≤`` the part of slot ``k`` after its
    arrival), no class is over-used in any slot, every job's work is done, and ``z[j]`` is
    at least the job's mean busy time − its arrival + half its fastest run time (its work
    in a slot counted at the slot's start) and at least the time it runs,
    ``Σ_{c,k} x[j,c,k]·slot`` plus its work after the horizon at its fastest rate. The
    second matters where a policy keeps long jobs on slow devices: the first alone
    charges such a job half its fastest run time, however slowly it runs. Minimised:
    ``Σ_j z[j]`` (HiGHS picks the method: its dual simplex, faster than its interior
    point on most of the sweep's traces, though not on Gavel's microbenchmark).
    """
    classes = ClusterClasses.of(cluster)
    class_row = {c: i for i, c in enumerate(classes.ids)}
    slot_s = horizon_s / slots
    lp = _Program(num_rows=slots * len(class_row))
    lp.b_ub = [float(len(ids)) for _ in range(slots) for ids in classes.ids.values()]
    for j, job in enumerate(trace):
        configs = job_configs(classes, job, rates)
        work = job.steps * job.global_batch
        fastest_s = work / max(r for _, r in configs)
        jct_row = lp.row(-fastest_s / 2)  # mean busy time - arrival + fastest/2 <= z[j]
        busy_row = lp.row(0.0)  # time it runs <= z[j]
        for k in range(int(job.arrival_s // slot_s), slots):
            start_s = max(k * slot_s, job.arrival_s)
            if start_s >= (k + 1) * slot_s:
                continue
            one_config = lp.row(((k + 1) * slot_s - start_s) / slot_s)
            for config, r in configs:
                share = r * slot_s / work  # of the job's work, per unit of x
                var = lp.var(0.0, 0.0)
                lp.ub(one_config, var, 1.0)
                lp.ub(busy_row, var, slot_s)
                lp.ub(jct_row, var, (start_s - job.arrival_s) * share)
                for device_class, n in config.parts:
                    lp.ub(k * len(class_row) + class_row[device_class], var, float(n))
                lp.eq(j, var, share)
        after = lp.var(0.0, 0.0)
        lp.ub(jct_row, after, max(horizon_s - job.arrival_s, 0.0))
        lp.ub(busy_row, after, fastest_s)
        lp.eq(j, after, 1.0)
        z = lp.var(1.0, fastest_s)
        lp.ub(jct_row, z, -1.0)
        lp.ub(busy_row, z, -1.0)
    return lp.minimum(len(trace)) / len(trace)


class _Program:
    """A sparse linear program built entry by entry: ``min cost·v`` subject to
    ``A_ub·v ≤ b_ub``, ``A_eq·v = 1`` (one row per job) and ``v ≥ lower``."""

    def __init__(self, *, num_rows: int) -> None:
        self.num_rows = num_rows
        self.b_ub: list[float] = []
        self.cost: list[float] = []
        self.lower: list[float] = []
        self.ub_at: list[tuple[int, int, float]] = []
        self.eq_at: list[tuple[int, int, float]] = []

    def row(self, bound: float) -> int:
        """A new ``≤ bound`` row."""
        self.b_ub.append(bound)
        self.num_rows += 1
        return self.num_rows - 1

    def var(self, cost: float, lower: float) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        return len(self.cost) - 1

    def ub(self, row: int, var: int, value: float) -> None:
        self.ub_at.append((row, var, value))

    def eq(self, row: int, var: int, value: float) -> None:
        self.eq_at.append((row, var, value))

    def minimum(self, num_eq: int) -> float:
        n = len(self.cost)
        result = linprog(
            np.array(self.cost),
            A_ub=_sparse(self.ub_at, (self.num_rows, n)),
            b_ub=np.array(self.b_ub),
            A_eq=_sparse(self.eq_at, (num_eq, n)),
            b_eq=np.ones(num_eq),
            bounds=np.array([(lo, np.inf) for lo in self.lower]),
            method="highs",
        )
        if result.status != 0:
            raise RuntimeError(f"the bound's linear program failed: {result.message}")
        return float(result.fun)


def _sparse(entries: list[tuple[int, int, float]], shape: tuple[int, int]) -> Any:
    rows, cols, values = zip(*entries, strict=True) if entries else ((), (), ())
    return coo_array((values, (rows, cols)), shape=shape).tocsr()
