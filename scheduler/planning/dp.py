"""Data-parallel planners: ``dp`` (optimal uneven split), ``even`` and ``proportional``.

``dp`` minimises the slowest device's busy time exactly under the cost model of
:mod:`scheduler.cost.costmodel` (the argument is :func:`_optimal`'s); ``even`` is
what DDP does, ``proportional`` shares by device speed. All three work on NumPy
arrays of the usable devices, so 16,384 devices plan in a fraction of a second.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ring_allreduce_s, slowest_link_gbps
from scheduler.cost.profile import DeviceProfile, Profile
from scheduler.cost.table import DeviceTable, figures_key
from scheduler.errors import PlanError
from scheduler.models.activations import RECOMPUTE_MODES
from scheduler.planning.plan import (
    Baseline,
    DevicePlanTable,
    Excluded,
    Plan,
    check_global_batch,
)
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
    identical figures form one *kind* (the ``kind_*`` arrays, one column per kind, the
    kinds of the profile's :class:`~scheduler.cost.table.DeviceTable`, or of
    :func:`~scheduler.cost.table.figures_key`): an analytic profile of 16,384 devices has a
    few dozen kinds, and the search runs on those (:func:`_optimal`)."""

    kinds: Sequence[DeviceProfile]
    """One device of each kind."""
    all_ids: Sequence[str]
    """The profile's device ids, in order."""
    rows: IntArray
    """Each device's position among the profile's devices, in device order."""
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
    kind_per_sample_bytes: IntArray
    """Activation bytes per sample, per mode and kind (0 where it lacks the mode)."""

    def subset(self, mask: npt.NDArray[np.bool_]) -> _Group:
        return replace(
            self,
            rows=self.rows[mask],
            max_micro=self.max_micro[:, mask],
            fixed_s=self.fixed_s[:, mask],
            per_sample_s=self.per_sample_s[:, mask],
            node_codes=self.node_codes[mask],
            kind_of=self.kind_of[mask],
        )

    @property
    def size(self) -> int:
        return len(self.rows)

    def ids(self) -> list[str]:
        """The devices' ids, in device order."""
        ids = self.all_ids
        if len(self.rows) == len(ids):  # every device of the profile, in its order
            return list(ids)
        return [ids[i] for i in self.rows.tolist()]

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


def _kind_columns(d: DeviceProfile) -> tuple[list[int], list[float], list[float], list[int]]:
    """One device's ``(max_micro, fixed_s, per_sample_s, per_sample_bytes)`` per mode
    (RECOMPUTE_MODES order)."""
    max_micro = [d.max_micro_batch(), 0, 0]
    fixed_s = [d.fixed_s, 1.0, 1.0]
    per_sample_s = [d.per_sample_s, 1.0, 1.0]
    per_sample_bytes = [d.per_sample_bytes, 0, 0]
    for row, cost in ((1, d.selective), (2, d.full)):
        if cost is not None:
            max_micro[row] = d.max_micro_batch(cost.per_sample_bytes)
            fixed_s[row] = d.fixed_s if cost.fixed_s is None else cost.fixed_s
            per_sample_s[row] = cost.per_sample_s
            per_sample_bytes[row] = cost.per_sample_bytes
    return max_micro, fixed_s, per_sample_s, per_sample_bytes


def _prepare(devices: Sequence[DeviceProfile]) -> tuple[_Group, list[Excluded]]:
    """The usable devices as a group, the others with a reason; PlanError if none.

    Everything per device is an array indexed by kind (one Python step per kind, a few
    per device), so a profile of 16,384 devices prepares in milliseconds."""
    table = DeviceTable.of(devices, key=figures_key)
    fits = [k.fits_one_sample() for k in table.kinds]
    kind_of = np.array(table.kind_of, dtype=np.int64)
    if all(fits):
        rows = np.arange(len(table.ids), dtype=np.int64)
        excluded: list[Excluded] = []
    else:
        usable = np.array(fits, dtype=np.bool_)[kind_of]
        rows = np.flatnonzero(usable)
        reasons = [
            None if ok else _exclusion(k).reason for k, ok in zip(table.kinds, fits, strict=True)
        ]
        excluded = [
            Excluded(id=table.ids[i], reason=str(reasons[table.kind_of[i]]))
            for i in np.flatnonzero(~usable).tolist()
        ]
        if not len(rows):
            shown = "; ".join(f"{e.id}: {e.reason}" for e in excluded[:3])
            more = f" (and {len(excluded) - 3} more)" if len(excluded) > 3 else ""
            raise PlanError(f"no device can hold the model: {shown}{more}")
    # node names in order of first appearance, then each device's index among them
    node_index = {n: i for i, n in enumerate(dict.fromkeys(table.nodes))}
    node_codes = np.fromiter(map(node_index.__getitem__, table.nodes), np.int64, len(table.ids))
    columns = [_kind_columns(k) for k in table.kinds]

    def by_mode(i: int) -> list[list[float]]:  # (modes, kinds): column i of each kind
        return [list(row) for row in zip(*(c[i] for c in columns), strict=True)]

    kind_max_micro: IntArray = np.array(by_mode(0), dtype=np.int64)
    kind_fixed_s: FloatArray = np.array(by_mode(1), dtype=np.float64)
    kind_per_sample_s: FloatArray = np.array(by_mode(2), dtype=np.float64)
    kind_bytes: IntArray = np.array(by_mode(3), dtype=np.int64)
    of = kind_of[rows]
    return (
        _Group(
            kinds=table.kinds,
            all_ids=table.ids,
            rows=rows,
            max_micro=kind_max_micro[:, of],
            fixed_s=kind_fixed_s[:, of],
            per_sample_s=kind_per_sample_s[:, of],
            node_codes=node_codes[rows],
            nodes=tuple(node_index),
            kind_of=of,
            kind_max_micro=kind_max_micro,
            kind_fixed_s=kind_fixed_s,
            kind_per_sample_s=kind_per_sample_s,
            kind_per_sample_bytes=kind_bytes,
        ),
        excluded,
    )


def _step_s(
    profile: Profile, group: _Group, samples: IntArray, busy: FloatArray | None = None
) -> tuple[float, float]:
    """``(compute_s, comm_s)`` of a split: slowest device, then the ring all-reduce
    (``busy``: the devices' busy times, when already known)."""
    compute = float((group.busy_s(samples) if busy is None else busy).max())
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
    base = _caps(_bracket_low(f, p, m, size, global_batch), f, p, m, global_batch)
    missing = global_batch - int((base * size).sum())
    kinds = group.kind_of
    if missing <= 0:
        out: IntArray = base[kinds]
        return out
    counts, promoted = _hand_out(base.tolist(), missing, m, f, p, kinds=kinds, size=size)
    result: IntArray = np.array(counts, dtype=np.int64)[kinds] + (
        _rank_in_kind(kinds, size) < np.array(promoted, dtype=np.int64)[kinds]
    )
    return result


def _bracket_low(
    f: FloatArray, p: FloatArray, m: IntArray, size: IntArray, global_batch: int
) -> float:
    """The low end ``lo`` of the bisection's final bracket ``(lo, hi]``: ``Σ cap(lo) < B``
    (or ``lo = 0``), ``Σ cap(hi) ≥ B``, and no float strictly between them; ``hi`` starts
    at the fastest kind's busy time for the whole batch, where ``Σ cap ≥ B`` holds."""
    whole = np.full(m.shape[1], global_batch, dtype=np.int64)
    lo = 0.0
    hi = float(_busy_by_mode(m, f, p, whole).min(axis=0)[size > 0].min())
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if int((_caps(mid, f, p, m, global_batch) * size).sum()) >= global_batch:
            hi = mid
        else:
            lo = mid
    return lo


def _hand_out(
    counts: list[int],
    missing: int,
    m: IntArray,
    f: FloatArray,
    p: FloatArray,
    *,
    kinds: IntArray,
    size: IntArray,
) -> tuple[list[int], list[int]]:
    """``missing`` more samples on top of ``counts`` per kind, cheapest next sample first
    (exact busy time, best mode): per kind, the count every device has (``counts``,
    updated) and how many of its devices, lowest index first, hold one more
    (``promoted``). The order is a heap over every device's next sample, ties by device
    index; a kind's devices at its lower count all cost the same, so they move in runs."""
    promoted = [0] * len(counts)
    # the devices of kind k, in device order: by_kind[starts[k] : starts[k] + size[k]]
    by_kind: list[int] = np.argsort(kinds, kind="stable").tolist()
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
        cost, _, k = heapq.heappop(heap)
        # The kind's devices still at its lower count all cost `cost` for their next sample;
        # one pop each would take them in index order while they stay below the heap's next
        # entry: all of them, or (on a tie in cost) those of lower index than that entry's.
        first, end = starts[k] + promoted[k], starts[k] + sizes[k]
        if heap and heap[0][0] == cost:
            end = max(bisect.bisect_left(by_kind, heap[0][1], first, end), first + 1)
        take = min(end - first, missing)
        promoted[k] += take
        missing -= take
        if promoted[k] == sizes[k]:  # every device of the kind moved up one
            counts[k] += 1
            promoted[k] = 0
        heapq.heappush(heap, (busy(k, counts[k] + 1), by_kind[starts[k] + promoted[k]], k))
    return counts, promoted


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
    group, excluded = _prepare(devices)
    if excluded:
        raise PlanError(f"optimal_split: {excluded[0].id}: {excluded[0].reason}")
    counts: list[int] = _optimal(group, global_batch).tolist()
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
    return _largest_remainder(np.ones(group.size), global_batch)


def _proportional(group: _Group, global_batch: int) -> IntArray:
    """Shares by speed (``1/per_sample_s``: peak TFLOP/s for analytic profiles,
    measured speed for measured ones), largest remainder rounding."""
    return _largest_remainder(1.0 / group.fastest_per_sample_s, global_batch)


_SPLITS: dict[str, Callable[[_Group, int], IntArray]] = {
    "optimal": _optimal,
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
    by_mode = group.busy_by_mode(samples)
    modes = by_mode.argmin(axis=0)  # ties: less recomputation
    busy = by_mode.min(axis=0)
    columns = np.arange(group.size)
    max_micro = group.max_micro[modes, columns]
    num_micro = -(-samples // np.maximum(max_micro, 1))
    micro = np.where(samples > 0, -(-samples // np.maximum(num_micro, 1)), 0)
    offsets = np.cumsum(samples) - samples
    # a device without samples runs no mode: "none", and its peak is its model states
    modes = np.where(samples > 0, modes, 0)
    kinds = group.kinds
    static = np.array([k.static_bytes for k in kinds], dtype=np.int64)[group.kind_of]
    peak = static + micro * group.kind_per_sample_bytes[modes, group.kind_of]
    precision_of = [k.precision for k in kinds]
    entries = DevicePlanTable(
        ids=group.ids(),
        samples=samples.tolist(),
        micro_batch=micro.tolist(),
        accum_steps=num_micro.tolist(),
        busy_s=busy.tolist(),
        peak_bytes=peak.tolist(),
        offset=offsets.tolist(),
        recompute=[RECOMPUTE_MODES[m] for m in modes.tolist()],
        precision=[precision_of[k] for k in group.kind_of.tolist()],
    )
    compute, comm = _step_s(profile, group, samples, busy)
    return Plan(
        strategy=strategy,
        global_batch=int(samples.sum()),
        predicted_step_s=compute + comm,
        compute_s=compute,
        comm_s=comm,
        devices=entries,
        excluded=tuple(excluded),
        notes=tuple(notes),
    )


class _Splits:
    """The splits one planning call prices, each split and priced once: ``dp`` weighs
    the baselines against its own split and the plan then reports them."""

    def __init__(self, profile: Profile, group: _Group, global_batch: int) -> None:
        self.profile, self.group, self.global_batch = profile, group, global_batch
        self._priced: dict[str, tuple[IntArray, float]] = {}

    def priced(self, name: str) -> tuple[IntArray, float]:
        """``(samples, predicted step seconds)`` of the ``name`` split."""
        if name not in self._priced:
            split = _SPLITS[name](self.group, self.global_batch)
            self._priced[name] = split, sum(_step_s(self.profile, self.group, split))
        return self._priced[name]

    def baselines(self) -> dict[str, Baseline]:
        """Predicted step time of each baseline, without building its plan."""
        out = {}
        for name in BASELINES:
            step = self.priced(name)[1]
            out[name] = Baseline(
                predicted_step_s=step,
                predicted_samples_per_s=self.global_batch / step if step > 0 else 0.0,
            )
        return out


def _dp(splits: _Splits, excluded: list[Excluded]) -> Plan:
    """The optimal split, or a cheaper-to-reduce one when its step is faster.

    Devices may end with zero samples when that is faster; they then sit out the
    all-reduce. The all-reduce term depends only on who takes part, so the
    fastest single node alone (intra-node links) is planned too and the lower
    total step time kept.
    """
    profile, group, global_batch = splits.profile, splits.group, splits.global_batch
    samples, step = splits.priced("optimal")
    if len(group.nodes) > 1 and profile.gradient_bytes > 0:
        # The fastest node alone avoids the inter-node all-reduce; keep it when faster.
        speed = np.bincount(group.node_codes, weights=1.0 / group.fastest_per_sample_s)
        best = int(np.argmax(speed))
        on_node = group.node_codes == best
        one_node = group.subset(on_node)
        one_samples = _optimal(one_node, global_batch)
        if sum(_step_s(profile, one_node, one_samples)) < step:
            node = group.nodes[best]
            reason = (
                f"idle: training on {node} alone avoids the inter-node all-reduce and is faster"
            )
            left_out = [Excluded(id=i, reason=reason) for i in group.subset(~on_node).ids()]
            return _build("dp", profile, one_node, one_samples, [*excluded, *left_out])
    # The optimal split minimises the slowest device's busy time; the all-reduce is added
    # after. A baseline split on fewer devices can save more all-reduce than it loses in
    # compute (everything on one device: none at all), so dp is never slower than them.
    chosen, _ = min(
        (splits.priced(name) for name in ("optimal", *BASELINES)), key=lambda priced: priced[1]
    )
    return _build("dp", profile, group, chosen, excluded)


def _plan(strategy: str, splits: _Splits, excluded: list[Excluded]) -> Plan:
    if strategy == "dp":
        return _dp(splits, excluded)
    return _build(strategy, splits.profile, splits.group, splits.priced(strategy)[0], excluded)


def _planned(strategy: str, profile: Profile, global_batch: int) -> tuple[Plan, _Splits]:
    check_global_batch(global_batch)
    group, excluded = _prepare(profile.devices)
    splits = _Splits(profile, group, global_batch)
    return _plan(strategy, splits, excluded), splits


def plan_dp(profile: Profile, global_batch: int) -> Plan:
    return _planned("dp", profile, global_batch)[0]


def plan_even(profile: Profile, global_batch: int) -> Plan:
    return _planned("even", profile, global_batch)[0]


def plan_proportional(profile: Profile, global_batch: int) -> Plan:
    return _planned("proportional", profile, global_batch)[0]


DP_PLANNERS: dict[str, Callable[[Profile, int], Plan]] = {
    "dp": plan_dp,
    "even": plan_even,
    "proportional": plan_proportional,
}


def baseline_of(plan: Plan) -> Baseline:
    return Baseline(
        predicted_step_s=plan.predicted_step_s, predicted_samples_per_s=plan.predicted_samples_per_s
    )


def plan_with_baselines(profile: Profile, global_batch: int, strategy: str) -> Plan:
    """The ``strategy`` plan (one of :data:`DP_PLANNERS`) with the ``even`` and
    ``proportional`` baselines, the devices grouped and each split priced once."""
    plan, splits = _planned(strategy, profile, global_batch)
    return plan.with_baselines(splits.baselines())


def dp_baselines(profile: Profile, global_batch: int, *, with_dp: bool) -> dict[str, Baseline]:
    """The ``even`` and ``proportional`` baselines, and ``dp`` when ``with_dp``, for a
    plan of another strategy; :class:`PlanError` when no device holds the whole model."""
    group, excluded = _prepare(profile.devices)
    splits = _Splits(profile, group, global_batch)
    baselines = splits.baselines()
    if with_dp:
        baselines["dp"] = baseline_of(_dp(splits, excluded))
    return baselines
