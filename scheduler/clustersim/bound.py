"""Lower bounds on a trace's average JCT: what no policy can beat on a cluster.

Two bounds, both over the configurations the policies choose among
(:func:`~scheduler.policy.configs.candidates` within each job's device bounds, batch
and types), both without restart costs:

- :func:`alone_avg_jct_s`: every job alone on the cluster from its arrival, on its
  fastest configuration. It ignores that jobs share the cluster, so on a cluster whose
  fast devices are few it is far below what any schedule reaches.
- :func:`shared_avg_jct_s`: a time-indexed linear program that keeps the cluster's
  capacity per device class in every time slot, with the mean-busy-time relaxation of
  completion time (Hall, Schulz, Shmoys and Wein, Math. Oper. Res. 1997; Queyranne
  and Schulz's polyhedral view of scheduling). A job whose work is done at a rate of at
  most its fastest configuration's finishes no earlier than its mean busy time plus
  half its fastest run time, so the program's optimum is below every schedule's average
  JCT. Time is cut into slots, a job's work in a slot is charged at the slot's start,
  and work after the horizon at the horizon, which keeps the bound valid for any
  horizon and slot length (a longer horizon and shorter slots tighten it).

The sweep (tests/benchmarks/test_policy_sweep.py) reports both beside each policy's
replay: the larger of the two is the most any policy could gain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    """A lower bound on the average JCT of any schedule of ``trace`` on ``cluster``.

    Variables ``x[j,c,k] ≥ 0``: the share of slot ``k`` in which job ``j`` runs
    configuration ``c`` (from its arrival on); ``y[j] ≥ 0``: the share of its work done
    after ``horizon_s``. Constraints: a job runs at most one configuration at a time
    (``Σ_c x[j,c,k] ≤`` the part of slot ``k`` after its arrival), no class is over-used
    in any slot, and every job's work is done. Minimised: ``Σ_j`` (mean busy time − arrival
    + half the job's fastest run time), its work in a slot counted at the slot's start.
    """
    classes = ClusterClasses.of(cluster)
    class_row = {c: i for i, c in enumerate(classes.ids)}
    slot_s = horizon_s / slots
    ub_rows = slots * len(class_row)
    b_ub = [float(len(ids)) for _ in range(slots) for ids in classes.ids.values()]
    ub_i: list[int] = []
    ub_j: list[int] = []
    ub_v: list[float] = []
    eq_j: list[int] = []
    eq_i: list[int] = []
    eq_v: list[float] = []
    cost: list[float] = []
    constant_s = 0.0
    for j, job in enumerate(trace):
        configs = job_configs(classes, job, rates)
        work = job.steps * job.global_batch
        constant_s += work / max(r for _, r in configs) / 2
        for k in range(int(job.arrival_s // slot_s), slots):
            start_s = max(k * slot_s, job.arrival_s)
            if start_s >= (k + 1) * slot_s:
                continue
            b_ub.append(((k + 1) * slot_s - start_s) / slot_s)
            for config, r in configs:
                share = r * slot_s / work  # of the job's work, per unit of x
                var = len(cost)
                cost.append((start_s - job.arrival_s) * share)
                ub_i.append(ub_rows)
                ub_j.append(var)
                ub_v.append(1.0)
                for device_class, n in config.parts:
                    ub_i.append(k * len(class_row) + class_row[device_class])
                    ub_j.append(var)
                    ub_v.append(float(n))
                eq_i.append(j)
                eq_j.append(var)
                eq_v.append(share)
            ub_rows += 1
        eq_i.append(j)
        eq_j.append(len(cost))
        eq_v.append(1.0)
        cost.append(max(horizon_s - job.arrival_s, 0.0))
    n = len(cost)
    result = linprog(
        np.array(cost),
        A_ub=coo_array((ub_v, (ub_i, ub_j)), shape=(ub_rows, n)).tocsr(),
        b_ub=np.array(b_ub),
        A_eq=coo_array((eq_v, (eq_i, eq_j)), shape=(len(trace), n)).tocsr(),
        b_eq=np.ones(len(trace)),
        bounds=(0, None),
        method="highs",
    )
    if result.status != 0:
        raise RuntimeError(f"the bound's linear program failed: {result.message}")
    bound_s = (result.fun + constant_s) / len(trace)
    return bound_s if math.isfinite(bound_s) else 0.0
