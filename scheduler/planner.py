"""Data-parallel planners: ``dp`` (optimal uneven split), ``even`` and ``proportional``.

``dp`` minimises the slowest device's busy time exactly under the cost model
of :mod:`scheduler.costmodel`. Why it is optimal: each device's busy time
``b_i(n) = ceil(n/m_i)·f_i + n·p_i`` is non-decreasing in ``n``, so for any
time budget ``T`` device ``i`` can take at most ``cap_i(T) = max{n : b_i(n) ≤ T}``
samples and a split with slowest busy time ``≤ T`` exists iff
``Σ cap_i(T) ≥ B``. That predicate is monotone in ``T``, so the optimum ``T*``
is the smallest value of the finite set ``{b_i(n)}`` where it holds. We
bisect on ``T`` until the bracket ``(lo, hi]`` holds no ``b_i(n)`` other than
those of the last samples that ``hi`` admits (``Σ cap(lo) < B ≤ Σ cap(hi)``),
start from ``cap(lo)`` and hand out the ``B − Σ cap(lo)`` missing samples in
increasing order of the busy time they cause (a heap). Every sample added
costs a value ``b_i(n) ≤ T*`` before any larger one, so the result's slowest
busy time is exactly ``T*``. Using each device's largest fitting micro-batch
is optimal too: for fixed ``n`` fewer micro-batches are never slower.
Devices may end with zero samples when that is faster; they then sit out the
all-reduce. The all-reduce term depends only on who takes part, so the
planner also considers the fastest single node alone (intra-node links) and
keeps whichever total step time is lower. Vectorised with NumPy: 16,384
devices plan in well under a second.

``even`` gives every device that can hold the model the same share (DDP), as
equal as integers allow; ``proportional`` shares by device speed (peak
TFLOP/s for analytic profiles, ``1/per_sample_s`` for measured ones) with
largest-remainder rounding. Both cap micro-batches by memory and accumulate.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from scheduler.costmodel import (
    balanced_micro_batch,
    busy_s,
    peak_bytes,
    ring_allreduce_s,
    slowest_link_gbps,
)
from scheduler.errors import PlanError
from scheduler.plan import Baseline, DevicePlan, Excluded, Plan
from scheduler.profile import DeviceProfile, Profile

GB = 1e9


def _gb(num_bytes: float) -> str:
    if num_bytes >= 0.1 * GB:
        return f"{num_bytes / GB:.1f} GB"
    return f"{num_bytes / 1e6:.1f} MB"


def split_fitting(profile: Profile) -> tuple[list[DeviceProfile], list[Excluded]]:
    """Devices that can run a micro-batch of one sample, and the others with a reason."""
    usable, excluded = [], []
    for d in profile.devices:
        if d.max_micro_batch() >= 1:
            usable.append(d)
        elif d.static_bytes > d.capacity_bytes:
            excluded.append(Excluded(id=d.id, reason=(
                f"model states {_gb(d.static_bytes)} exceed capacity {_gb(d.capacity_bytes)}")))
        else:
            excluded.append(Excluded(id=d.id, reason=(
                f"model states {_gb(d.static_bytes)} + one sample {_gb(d.per_sample_bytes)} "
                f"exceed capacity {_gb(d.capacity_bytes)}")))
    return usable, excluded


def check_global_batch(global_batch: int) -> None:
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise PlanError(f"global_batch: must be an integer >= 1, got {global_batch!r}")


def _require_usable(usable: list[DeviceProfile], excluded: list[Excluded]) -> None:
    if not usable:
        reasons = "; ".join(f"{e.id}: {e.reason}" for e in excluded[:3])
        more = f" (and {len(excluded) - 3} more)" if len(excluded) > 3 else ""
        raise PlanError(f"no device can hold the model: {reasons}{more}")


# --- the optimal split ---------------------------------------------------


def _caps(t: float, f: np.ndarray, p: np.ndarray, m: np.ndarray, batch: int) -> np.ndarray:
    """``cap_i(t)``: most samples device ``i`` finishes within ``t`` seconds."""
    full = np.floor(t / (f + m * p))  # micro-batches that fit whole
    n_full = full * m
    # ... or one more, partly filled, micro-batch
    n_more = np.floor((t - (full + 1) * f) / p)
    n_more = np.minimum(np.maximum(n_more, 0), (full + 1) * m)
    return np.minimum(np.maximum(n_full, n_more), batch).astype(np.int64)


def optimal_split(devices: Sequence[DeviceProfile], global_batch: int) -> list[int]:
    """Samples per device minimising the slowest busy time (see module docstring)."""
    f = np.array([d.fixed_s for d in devices], dtype=np.float64)
    p = np.array([d.per_sample_s for d in devices], dtype=np.float64)
    m_int = [min(d.max_micro_batch(), global_batch) for d in devices]
    m = np.array(m_int, dtype=np.float64)
    lo = 0.0
    hi = min(busy_s(d, global_batch, mi) for d, mi in zip(devices, m_int, strict=True))
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if int(_caps(mid, f, p, m, global_batch).sum()) >= global_batch:
            hi = mid
        else:
            lo = mid
    samples = _caps(lo, f, p, m, global_batch).tolist()
    # The caps at lo are within every budget >= lo; add the missing samples
    # cheapest-first. Only devices whose next sample costs <= hi can be picked
    # before T* is reached, and the heap takes them in exact busy-time order.
    missing = global_batch - sum(samples)
    heap = [
        (busy_s(d, n + 1, mi), i)
        for i, (d, n, mi) in enumerate(zip(devices, samples, m_int, strict=True))
    ]
    heapq.heapify(heap)
    while missing > 0:
        _, i = heapq.heappop(heap)
        samples[i] += 1
        missing -= 1
        heapq.heappush(heap, (busy_s(devices[i], samples[i] + 1, m_int[i]), i))
    return samples


def proportional_split(weights: Sequence[float], global_batch: int) -> list[int]:
    """Largest-remainder apportionment of ``global_batch`` by ``weights``.

    >>> proportional_split([1.0, 1.0, 1.0], 10)
    [4, 3, 3]
    """
    total = float(sum(weights))
    exact = [w / total * global_batch for w in weights]
    shares = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (shares[i] - exact[i], i))
    for i in order[: global_batch - sum(shares)]:
        shares[i] += 1
    return shares


# --- plans -----------------------------------------------------------------


def build_plan(
    *,
    strategy: str,
    profile: Profile,
    devices: Sequence[DeviceProfile],
    samples: Sequence[int],
    excluded: Sequence[Excluded],
    notes: Sequence[str] = (),
) -> Plan:
    """Turn a split into a plan: micro-batches, offsets, predicted times."""
    global_batch = sum(samples)
    entries, offset = [], 0
    for d, n in zip(devices, samples, strict=True):
        micro, accum = balanced_micro_batch(n, d.max_micro_batch()) if n else (0, 0)
        entries.append(DevicePlan(
            id=d.id, samples=n, micro_batch=micro, accum_steps=accum,
            busy_s=busy_s(d, n, d.max_micro_batch()) if n else 0.0,
            peak_bytes=peak_bytes(d, micro), offset=offset,
        ))
        offset += n
    active = [d for d, n in zip(devices, samples, strict=True) if n > 0]
    compute = max(e.busy_s for e in entries)
    comm = ring_allreduce_s(len(active), profile.gradient_bytes,
                            slowest_link_gbps(profile.links, (d.node for d in active)))
    return Plan(strategy=strategy, global_batch=global_batch, predicted_step_s=compute + comm,
                compute_s=compute, comm_s=comm, devices=tuple(entries),
                excluded=tuple(excluded), notes=tuple(notes))


def _fastest_node(usable: Sequence[DeviceProfile]) -> list[DeviceProfile]:
    speed: dict[str, float] = {}
    for d in usable:
        speed[d.node] = speed.get(d.node, 0.0) + 1.0 / d.per_sample_s
    best = max(speed, key=lambda node: speed[node])
    return [d for d in usable if d.node == best]


def plan_dp(profile: Profile, global_batch: int) -> Plan:
    check_global_batch(global_batch)
    usable, excluded = split_fitting(profile)
    _require_usable(usable, excluded)
    best = build_plan(strategy="dp", profile=profile, devices=usable,
                      samples=optimal_split(usable, global_batch), excluded=excluded)
    if len({d.node for d in usable}) > 1 and profile.gradient_bytes > 0:
        node_devices = _fastest_node(usable)
        node = node_devices[0].node
        left_out = [Excluded(id=d.id, reason=f"idle: training on {node} alone avoids the "
                             "inter-node all-reduce and is faster")
                    for d in usable if d.node != node]
        one_node = build_plan(strategy="dp", profile=profile, devices=node_devices,
                              samples=optimal_split(node_devices, global_batch),
                              excluded=[*excluded, *left_out])
        if one_node.predicted_step_s < best.predicted_step_s:
            best = one_node
    return best


def plan_even(profile: Profile, global_batch: int) -> Plan:
    check_global_batch(global_batch)
    usable, excluded = split_fitting(profile)
    _require_usable(usable, excluded)
    return build_plan(strategy="even", profile=profile, devices=usable,
                      samples=proportional_split([1.0] * len(usable), global_batch),
                      excluded=excluded)


def plan_proportional(profile: Profile, global_batch: int) -> Plan:
    check_global_batch(global_batch)
    usable, excluded = split_fitting(profile)
    _require_usable(usable, excluded)
    weights = [1.0 / d.per_sample_s for d in usable]
    return build_plan(strategy="proportional", profile=profile, devices=usable,
                      samples=proportional_split(weights, global_batch), excluded=excluded)


DP_PLANNERS = {"dp": plan_dp, "even": plan_even, "proportional": plan_proportional}
BASELINES = ("even", "proportional")


def baseline_of(plan: Plan) -> Baseline:
    return Baseline(predicted_step_s=plan.predicted_step_s,
                    predicted_samples_per_s=plan.predicted_samples_per_s)


def make_plan(profile: Profile, global_batch: int, strategy: str = "dp") -> Plan:
    """Plan ``strategy`` and report the ``even`` and ``proportional`` baselines with it."""
    planner = DP_PLANNERS.get(strategy)
    if planner is None:
        raise PlanError(f"strategy: unknown {strategy!r}; allowed: {', '.join(DP_PLANNERS)}")
    plan = planner(profile, global_batch)
    baselines = {name: baseline_of(plan if name == strategy else DP_PLANNERS[name](
        profile, global_batch)) for name in BASELINES}
    return plan.with_baselines(baselines)
