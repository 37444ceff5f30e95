"""Data-parallel planners: ``dp`` (optimal uneven split), ``even`` and ``proportional``.

``dp`` minimises the slowest device's busy time exactly under the cost model of
:mod:`scheduler.cost.costmodel` (the argument is :func:`_optimal`'s); ``even`` is
what DDP does, ``proportional`` shares by device speed. All three work on NumPy
arrays of the usable devices, so 16,384 devices plan in a fraction of a second.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ring_allreduce_s, slowest_link_gbps
from scheduler.cost.profile import DeviceProfile, Profile
from scheduler.errors import PlanError
from scheduler.models.activations import RECOMPUTE_MODES, Recompute
from scheduler.planning.plan import Baseline, DevicePlan, Excluded, Plan, check_global_batch
from scheduler.units import format_bytes

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


BASELINES = ("even", "proportional")


def _exclusion(d: DeviceProfile) -> Excluded:
    states, capacity = format_bytes(d.static_bytes), format_bytes(d.capacity_bytes)
    if d.static_bytes > d.capacity_bytes:
        return Excluded(id=d.id, reason=f"model states {states} exceed capacity {capacity}")
    least = min(d.options(), key=lambda o: o.per_sample_bytes)
    sample = format_bytes(least.per_sample_bytes)
    how = f" with {least.recompute} recomputation" if least.recompute != "none" else ""
    return Excluded(
        id=d.id,
        reason=f"model states {states} + one sample {sample}{how} exceed capacity {capacity}",
    )


def split_fitting(profile: Profile) -> tuple[list[DeviceProfile], list[Excluded]]:
    """Devices that can run a micro-batch of one sample (with some recomputation mode),
    and the others with a reason."""
    usable, excluded = [], []
    for d in profile.devices:
        if d.fits_one_sample():
            usable.append(d)
        else:
            excluded.append(_exclusion(d))
    return usable, excluded


# --- the devices as arrays ------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class _Group:
    """Usable devices as plain arrays, the form the search works on.

    Rows are recomputation modes (:data:`RECOMPUTE_MODES`), columns devices; a mode a
    device lacks, or in which one sample does not fit, has ``max_micro`` 0. Devices with
    identical figures form one *kind* (the ``kind_*`` arrays, one column per kind): an
    analytic profile of 16,384 devices has a few dozen kinds, and the search runs on
    those (:func:`_optimal`)."""

    devices: tuple[DeviceProfile, ...]
    max_micro: IntArray
    """Largest micro-batch that fits, per mode and device."""
    fixed_s: FloatArray
    per_sample_s: FloatArray
    node_codes: IntArray
    """Index of each device's node in ``nodes``."""
    nodes: tuple[str, ...]
    kind_of: IntArray
    """Index of each device's kind (a column of the ``kind_*`` arrays)."""
    kind_max_micro: IntArray
    kind_fixed_s: FloatArray
    kind_per_sample_s: FloatArray

    def subset(self, mask: npt.NDArray[np.bool_]) -> _Group:
        return _Group(
            devices=tuple(d for d, keep in zip(self.devices, mask.tolist(), strict=True) if keep),
            max_micro=self.max_micro[:, mask],
            fixed_s=self.fixed_s[:, mask],
            per_sample_s=self.per_sample_s[:, mask],
            node_codes=self.node_codes[mask],
            nodes=self.nodes,
            kind_of=self.kind_of[mask],
            kind_max_micro=self.kind_max_micro,
            kind_fixed_s=self.kind_fixed_s,
            kind_per_sample_s=self.kind_per_sample_s,
        )

    @property
    def fastest_per_sample_s(self) -> FloatArray:
        """Per device, the per-sample time of its fastest mode that fits."""
        p: FloatArray = np.where(self.max_micro > 0, self.per_sample_s, np.inf).min(axis=0)
        return p

    def busy_by_mode(self, samples: IntArray) -> FloatArray:
        """``ceil(n/m)·fixed_s + n·per_sample_s`` per mode and device; ``∞`` where it does
        not fit, zero for ``n = 0``."""
        return _busy_by_mode(self.max_micro, self.fixed_s, self.per_sample_s, samples)

    def busy_s(self, samples: IntArray) -> FloatArray:
        """Each device's busy time with its fastest mode for its sample count."""
        busy: FloatArray = self.busy_by_mode(samples).min(axis=0)
        return busy

    def modes(self, samples: IntArray) -> IntArray:
        """Index of each device's fastest mode (ties: less recomputation)."""
        chosen: IntArray = self.busy_by_mode(samples).argmin(axis=0)
        return chosen


def _busy_by_mode(m: IntArray, f: FloatArray, p: FloatArray, samples: IntArray) -> FloatArray:
    """``ceil(n/m)·f + n·p`` per mode (rows) and column; ``∞`` where the mode does not fit
    (``m = 0``), zero for ``n = 0``."""
    fits = m > 0
    num_micro = -(-samples // np.where(fits, m, 1))
    busy = np.where(fits, num_micro * f + samples * p, np.inf)
    out: FloatArray = np.where(samples > 0, busy, 0.0)
    return out


def _kind_columns(d: DeviceProfile) -> tuple[list[int], list[float], list[float]]:
    """One device's ``(max_micro, fixed_s, per_sample_s)`` per mode (RECOMPUTE_MODES order)."""
    max_micro = [d.max_micro_batch(), 0, 0]
    fixed_s = [d.fixed_s, 1.0, 1.0]
    per_sample_s = [d.per_sample_s, 1.0, 1.0]
    for row, cost in ((1, d.selective), (2, d.full)):
        if cost is not None:
            max_micro[row] = d.max_micro_batch(cost.per_sample_bytes)
            fixed_s[row] = d.fixed_s if cost.fixed_s is None else cost.fixed_s
            per_sample_s[row] = cost.per_sample_s
    return max_micro, fixed_s, per_sample_s


def _group(devices: Sequence[DeviceProfile]) -> _Group:
    # Devices are of one kind when they share every figure the search reads. The key
    # holds the recomputation figures by identity (an analytic profile shares one object
    # per kind; equal figures in distinct objects only make more kinds, never wrong ones).
    kinds: dict[tuple[object, ...], int] = {}
    nodes: dict[str, int] = {}
    kind_of, node_codes, firsts = [], [], []
    for d in devices:
        key = (
            d.capacity_bytes,
            d.static_bytes,
            d.per_sample_bytes,
            d.fixed_s,
            d.per_sample_s,
            d.micro_batch_limit,
            id(d.selective),
            id(d.full),
        )
        kind = kinds.get(key)
        if kind is None:
            kind = kinds[key] = len(kinds)
            firsts.append(d)
        kind_of.append(kind)
        node_codes.append(nodes.setdefault(d.node, len(nodes)))
    columns = [_kind_columns(d) for d in firsts]
    kind_max_micro = np.array([c[0] for c in columns], dtype=np.int64).T.reshape(3, -1)
    kind_fixed_s = np.array([c[1] for c in columns], dtype=np.float64).T.reshape(3, -1)
    kind_per_sample_s = np.array([c[2] for c in columns], dtype=np.float64).T.reshape(3, -1)
    of = np.array(kind_of, dtype=np.int64)
    return _Group(
        devices=tuple(devices),
        max_micro=kind_max_micro[:, of],
        fixed_s=kind_fixed_s[:, of],
        per_sample_s=kind_per_sample_s[:, of],
        node_codes=np.array(node_codes, dtype=np.int64),
        nodes=tuple(nodes),
        kind_of=of,
        kind_max_micro=kind_max_micro,
        kind_fixed_s=kind_fixed_s,
        kind_per_sample_s=kind_per_sample_s,
    )


def _prepare(profile: Profile) -> tuple[_Group, list[Excluded]]:
    """The usable devices as a group, the others with a reason; PlanError if none."""
    usable, excluded = split_fitting(profile)
    if not usable:
        reasons = "; ".join(f"{e.id}: {e.reason}" for e in excluded[:3])
        more = f" (and {len(excluded) - 3} more)" if len(excluded) > 3 else ""
        raise PlanError(f"no device can hold the model: {reasons}{more}")
    return _group(usable), excluded


def _step_s(profile: Profile, group: _Group, samples: IntArray) -> tuple[float, float]:
    """``(compute_s, comm_s)`` of a split: slowest device, then the ring all-reduce."""
    compute = float(group.busy_s(samples).max())
    active = samples > 0
    on = np.zeros(len(group.nodes), dtype=np.bool_)
    on[group.node_codes[active]] = True  # a mask, not np.unique: no sort of every device
    active_nodes = [group.nodes[c] for c in np.flatnonzero(on).tolist()]
    comm = ring_allreduce_s(
        int(active.sum()), profile.gradient_bytes, slowest_link_gbps(profile.links, active_nodes)
    )
    return compute, comm


# --- the splits ------------------------------------------------------------


def _caps(t: float, f: FloatArray, p: FloatArray, m: IntArray, batch: int) -> IntArray:
    """``cap_i(t)``: most samples device ``i`` finishes within ``t`` seconds, with its best
    mode (rows of ``f``, ``p``, ``m``; ``m = 0``: the mode does not fit)."""
    fits = m > 0
    mf = np.where(fits, m, 1).astype(np.float64)
    full = np.floor(t / (f + mf * p))  # micro-batches that fit whole
    n_full = full * mf
    # ... or one more, partly filled, micro-batch
    n_more = np.floor((t - (full + 1) * f) / p)
    n_more = np.minimum(np.maximum(n_more, 0), (full + 1) * mf)
    per_mode = np.where(fits, np.maximum(n_full, n_more), 0)
    caps: IntArray = np.minimum(per_mode.max(axis=0), batch).astype(np.int64)
    return caps


def _optimal(group: _Group, global_batch: int) -> IntArray:
    """Samples per device minimising the slowest busy time, exactly.

    Why it is optimal: each device's busy time ``b_i(n) = ceil(n/m_i)·f_i + n·p_i``
    is non-decreasing in ``n``, so for any time budget ``T`` device ``i`` can take
    at most ``cap_i(T) = max{n : b_i(n) ≤ T}`` samples and a split with slowest
    busy time ``≤ T`` exists iff ``Σ cap_i(T) ≥ B``. That predicate is monotone in
    ``T``, so the optimum ``T*`` is the smallest value of the finite set
    ``{b_i(n)}`` where it holds. We bisect on ``T`` until the bracket ``(lo, hi]``
    cannot shrink further (``Σ cap(lo) < B ≤ Σ cap(hi)``), start from ``cap(lo)``
    and hand out the ``B − Σ cap(lo)`` missing samples one at a time to the device
    whose next sample ends earliest (a heap). That greedy step never exceeds
    ``T*``: every device starts at or below ``T*``, and while fewer than ``B``
    samples are placed some device ``i`` holds fewer than ``cap_i(T*)`` samples,
    so the cheapest next sample costs at most ``T*``. The result's slowest busy
    time is therefore exactly ``T*``, whatever the bisection's floating-point end
    point. Using each device's largest fitting micro-batch is optimal too: for
    fixed ``n`` fewer micro-batches are never slower.

    Recomputation: a device may run in up to three modes ``r`` (``none``,
    ``selective``, ``full``), each with its own ``(m_ir, f_ir, p_ir)``; its busy
    time is the minimum ``b_i(n) = min_r b_ir(n)`` over the modes in which one
    sample fits. A minimum of non-decreasing functions is non-decreasing, so all
    of the above holds with that ``b_i``: ``cap_i(T) = max_r cap_ir(T)``, and the
    slowest busy time is exactly ``T*`` over all splits *and* all per-device mode
    choices. Each device then runs the mode that attains ``b_i`` at its final
    ``n`` (ties go to less recomputation), within its memory by construction.

    Devices of one kind (identical figures) have identical caps, so the bisection and
    the hand-out run over kinds, each weighted by its number of devices; the hand-out
    gives a kind's next sample to its lowest-index device still at the kind's lower
    count, which is the order a heap over every device pops them (ties by index).
    """
    f, p = group.kind_fixed_s, group.kind_per_sample_s
    m = np.minimum(group.kind_max_micro, global_batch)
    size = np.bincount(group.kind_of, minlength=m.shape[1])
    present = size > 0
    whole = np.full(m.shape[1], global_batch, dtype=np.int64)
    lo = 0.0
    hi = float(_busy_by_mode(m, f, p, whole).min(axis=0)[present].min())
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if int((_caps(mid, f, p, m, global_batch) * size).sum()) >= global_batch:
            hi = mid
        else:
            lo = mid
    base = _caps(lo, f, p, m, global_batch)
    missing = global_batch - int((base * size).sum())
    rank = _rank_in_kind(group.kind_of, size)
    if missing <= 0:
        out: IntArray = base[group.kind_of]
        return out
    # Hand out the missing samples cheapest-first (exact busy-time order, best mode).
    counts: list[int] = base.tolist()
    promoted = [0] * len(counts)
    # the devices of kind k, in device order: by_kind[starts[k] : starts[k] + size[k]]
    by_kind: list[int] = np.argsort(group.kind_of, kind="stable").tolist()
    starts: list[int] = (np.cumsum(size) - size).tolist()
    sizes: list[int] = size.tolist()
    micro, fixed, per_sample = m.tolist(), f.tolist(), p.tolist()

    def busy(k: int, n: int) -> float:
        return float(
            min(
                -(-n // micro[r][k]) * fixed[r][k] + n * per_sample[r][k]
                for r in range(len(micro))
                if micro[r][k] > 0
            )
        )

    heap = [(busy(k, counts[k] + 1), by_kind[starts[k]], k) for k in range(len(counts)) if sizes[k]]
    heapq.heapify(heap)
    while missing > 0:
        _, _, k = heapq.heappop(heap)
        promoted[k] += 1
        missing -= 1
        if promoted[k] == sizes[k]:  # every device of the kind moved up one
            counts[k] += 1
            promoted[k] = 0
        heapq.heappush(heap, (busy(k, counts[k] + 1), by_kind[starts[k] + promoted[k]], k))
    kinds = group.kind_of
    result: IntArray = np.array(counts, dtype=np.int64)[kinds] + (
        rank < np.array(promoted, dtype=np.int64)[kinds]
    )
    return result


def _rank_in_kind(kind_of: IntArray, size: IntArray) -> IntArray:
    """Each device's position among the devices of its kind, in device order."""
    order = np.argsort(kind_of, kind="stable")
    starts = np.cumsum(size) - size
    rank = np.empty_like(kind_of)
    rank[order] = np.arange(len(kind_of)) - starts[kind_of[order]]
    return rank


def optimal_split(devices: Sequence[DeviceProfile], global_batch: int) -> list[int]:
    """Samples per device minimising the slowest busy time (see :func:`_optimal`).

    Every device must fit a micro-batch of one sample (see :func:`split_fitting`).
    """
    counts: list[int] = _optimal(_group(devices), global_batch).tolist()
    return counts


def _largest_remainder(weights: FloatArray, global_batch: int) -> IntArray:
    total = float(sum(weights.tolist()))
    exact = weights / total * global_batch
    shares = np.trunc(exact).astype(np.int64)
    order = np.argsort(shares - exact, kind="stable")
    shares[order[: global_batch - int(shares.sum())]] += 1
    return shares


def proportional_split(weights: Sequence[float], global_batch: int) -> list[int]:
    """Largest-remainder apportionment of ``global_batch`` by ``weights``.

    >>> proportional_split([1.0, 1.0, 1.0], 10)
    [4, 3, 3]
    """
    shares: list[int] = _largest_remainder(
        np.array(weights, dtype=np.float64), global_batch
    ).tolist()
    return shares


def _even(group: _Group, global_batch: int) -> IntArray:
    """DDP's split: every usable device the same share, as equal as integers allow."""
    return _largest_remainder(np.ones(len(group.devices)), global_batch)


def _proportional(group: _Group, global_batch: int) -> IntArray:
    """Shares by speed (``1/per_sample_s``: peak TFLOP/s for analytic profiles,
    measured speed for measured ones), largest remainder rounding."""
    return _largest_remainder(1.0 / group.fastest_per_sample_s, global_batch)


_SPLITS: dict[str, Callable[[_Group, int], IntArray]] = {
    "even": _even,
    "proportional": _proportional,
}


# --- plans -----------------------------------------------------------------


def _build(
    strategy: str,
    profile: Profile,
    group: _Group,
    samples: IntArray,
    excluded: Sequence[Excluded],
    notes: Sequence[str] = (),
) -> Plan:
    """Turn a split into a plan: modes, micro-batches, offsets, predicted times."""
    modes = group.modes(samples)
    columns = np.arange(len(group.devices))
    max_micro = group.max_micro[modes, columns]
    num_micro = -(-samples // np.maximum(max_micro, 1))
    micro = np.where(samples > 0, -(-samples // np.maximum(num_micro, 1)), 0)
    offsets = np.cumsum(samples) - samples
    busy = group.busy_s(samples)
    entries = []
    for d, n, mb, k, b, o, mode in zip(
        group.devices,
        samples.tolist(),
        micro.tolist(),
        num_micro.tolist(),
        busy.tolist(),
        offsets.tolist(),
        modes.tolist(),
        strict=True,
    ):
        recompute: Recompute = RECOMPUTE_MODES[mode] if n > 0 else "none"
        per_sample_bytes = d.per_sample_bytes_with(recompute) or 0
        entries.append(
            DevicePlan(
                id=d.id,
                samples=n,
                micro_batch=mb,
                accum_steps=k,
                busy_s=b,
                peak_bytes=d.static_bytes + mb * per_sample_bytes,
                offset=o,
                recompute=recompute,
                precision=d.precision,
            )
        )
    compute, comm = _step_s(profile, group, samples)
    return Plan(
        strategy=strategy,
        global_batch=int(samples.sum()),
        predicted_step_s=compute + comm,
        compute_s=compute,
        comm_s=comm,
        devices=tuple(entries),
        excluded=tuple(excluded),
        notes=tuple(notes),
    )


def _dp(profile: Profile, group: _Group, excluded: list[Excluded], global_batch: int) -> Plan:
    """The optimal split, or a cheaper-to-reduce one when its step is faster.

    Devices may end with zero samples when that is faster; they then sit out the
    all-reduce. The all-reduce term depends only on who takes part, so the
    fastest single node alone (intra-node links) is planned too and the lower
    total step time kept.
    """
    samples = _optimal(group, global_batch)
    if len(group.nodes) > 1 and profile.gradient_bytes > 0:
        # The fastest node alone avoids the inter-node all-reduce; keep it when faster.
        speed = np.bincount(group.node_codes, weights=1.0 / group.fastest_per_sample_s)
        best = int(np.argmax(speed))
        on_node = group.node_codes == best
        one_node = group.subset(on_node)
        one_samples = _optimal(one_node, global_batch)
        if sum(_step_s(profile, one_node, one_samples)) < sum(_step_s(profile, group, samples)):
            node = group.nodes[best]
            left_out = [
                Excluded(
                    id=d.id,
                    reason=f"idle: training on {node} alone avoids the "
                    "inter-node all-reduce and is faster",
                )
                for d, keep in zip(group.devices, on_node.tolist(), strict=True)
                if not keep
            ]
            return _build("dp", profile, one_node, one_samples, [*excluded, *left_out])
    # The optimal split minimises the slowest device's busy time; the all-reduce is added
    # after. A baseline split on fewer devices can save more all-reduce than it loses in
    # compute (everything on one device: none at all), so dp is never slower than them.
    chosen = min(
        [samples, *(_SPLITS[name](group, global_batch) for name in BASELINES)],
        key=lambda split: sum(_step_s(profile, group, split)),
    )
    return _build("dp", profile, group, chosen, excluded)


def _plan(
    strategy: str, profile: Profile, group: _Group, excluded: list[Excluded], global_batch: int
) -> Plan:
    if strategy == "dp":
        return _dp(profile, group, excluded, global_batch)
    return _build(strategy, profile, group, _SPLITS[strategy](group, global_batch), excluded)


def plan_dp(profile: Profile, global_batch: int) -> Plan:
    check_global_batch(global_batch)
    return _plan("dp", profile, *_prepare(profile), global_batch)


def plan_even(profile: Profile, global_batch: int) -> Plan:
    check_global_batch(global_batch)
    return _plan("even", profile, *_prepare(profile), global_batch)


def plan_proportional(profile: Profile, global_batch: int) -> Plan:
    check_global_batch(global_batch)
    return _plan("proportional", profile, *_prepare(profile), global_batch)


DP_PLANNERS: dict[str, Callable[[Profile, int], Plan]] = {
    "dp": plan_dp,
    "even": plan_even,
    "proportional": plan_proportional,
}


def baseline_of(plan: Plan) -> Baseline:
    return Baseline(
        predicted_step_s=plan.predicted_step_s, predicted_samples_per_s=plan.predicted_samples_per_s
    )


def _baselines(profile: Profile, group: _Group, global_batch: int) -> dict[str, Baseline]:
    """Predicted step time of each baseline, without building its plan."""
    out = {}
    for name in BASELINES:
        step = sum(_step_s(profile, group, _SPLITS[name](group, global_batch)))
        out[name] = Baseline(
            predicted_step_s=step,
            predicted_samples_per_s=global_batch / step if step > 0 else 0.0,
        )
    return out


def plan_with_baselines(profile: Profile, global_batch: int, strategy: str) -> Plan:
    """The ``strategy`` plan (one of :data:`DP_PLANNERS`) with the ``even`` and
    ``proportional`` baselines, the devices grouped once for all three."""
    check_global_batch(global_batch)
    group, excluded = _prepare(profile)
    plan = _plan(strategy, profile, group, excluded, global_batch)
    return plan.with_baselines(_baselines(profile, group, global_batch))


def dp_baselines(profile: Profile, global_batch: int, *, with_dp: bool) -> dict[str, Baseline]:
    """The ``even`` and ``proportional`` baselines, and ``dp`` when ``with_dp``, for a
    plan of another strategy; :class:`PlanError` when no device holds the whole model."""
    group, excluded = _prepare(profile)
    baselines = _baselines(profile, group, global_batch)
    if with_dp:
        baselines["dp"] = baseline_of(_dp(profile, group, excluded, global_batch))
    return baselines
