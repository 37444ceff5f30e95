"""Fully-sharded data parallelism (``fsdp``): shards sized to memory, batches sized to speed.

What the runtime does, and so what this model prices (the contract of
:mod:`scheduler.planning.plan`, after ZeRO-3 / PyTorch FSDP: Rajbhandari et al., 2020;
Zhao et al., 2023, with uneven shards as in Cephalo, ICS'25):

- The model is cut into *units*: the embedding, each transformer block, the final
  norm with the head. Each unit is one flat fp32 parameter buffer, cut with
  :func:`~scheduler.planning.plan.shard_bounds` by the group's shard fractions
  ``f_i`` (Σ f_i = 1). A rank holds its slice of the parameters, of the fp32
  gradient and of both AdamW moments: ``f_i · 16 bytes`` per element of the model
  (:class:`~scheduler.cost.costs.ShardingFigures`, bytes per element kept as
  figures so other precisions plug in), plus what is held whole (buffers).
- Every rank runs the same number ``k`` of micro-batches (the collectives are per
  micro-batch, so ``accum_steps`` is one value per group); device ``i`` runs
  micro-batches of at most ``m_i`` samples, ``n_i ≤ k·m_i`` samples in all, and a
  device with no samples still owns a shard and joins every collective.
- Per micro-batch and unit: all-gather before forward (the next unit's gather is
  issued while the current one computes: prefetch depth 1), free it after use;
  all-gather again before backward, then reduce-scatter (SUM) the unit's gradient
  into the owned fp32 slice right after its backward. Memory in flight: two
  gathered parameter copies and one unsharded gradient of the largest unit.
- Collectives run over the slowest link of the group and are priced as rings
  whose every step moves the largest shard: ``(N − 1) · θ · elements · bytes / bandwidth``
  with ``θ = max_i f_i``, plus a latency per collective (``collective_latency_s``:
  about 1 ms on gloo, tens of µs on NCCL). That is exactly gloo's padded collective
  (padding counted) and the largest shard bounds an uneven NCCL one the same way, so uneven shards
  cost communication and the planner only makes them as uneven as memory needs.
  On gloo (``padded_collectives``) the gathered buffers hold ``N · θ`` × elements.
- Overlap rule: a unit's collectives (``2 gathers + 1 reduce-scatter``) overlap the
  compute of its neighbours, so per micro-batch

      τ = gather(embedding) + Σ_units max(C_u, comm_u),   C_u = max_i c_i(u, m_i)

  (the first gather is not overlapped; the slowest device's compute of a unit, since
  every collective waits for all ranks), and a step is ``k · τ``, each micro-batch
  priced at every device's largest. Loss scaling is that of ``dp`` (local over
  global samples, gradients summed), so the update equals one device's.
- HSDP (``shard_group``): identical nodes each shard the whole model and replicate
  across nodes; after the step's last reduce-scatter rank ``j`` of every group
  all-reduces its slice (same bounds in every group) over the inter-node link, once
  per step, not overlapped.

The search (:func:`solve_group`), for a shard vector ``f`` and each ``k``: minimise
``max_i Φ_i(m_i)``, ``Φ_i(m) = Σ_u n_u · max(c_i(u, m), comm_u)``, subject to
``Σ m_i ≥ ⌈B/k⌉`` and memory, by bisection on the bottleneck with a feasibility
check (each ``Φ_i`` is convex, increasing, piecewise linear: the maximum of eight
affine pieces, one per subset of units that are compute-bound, so its inverse is
closed-form; the argument that the bisection's end point is the optimum is
:func:`scheduler.planning.dp._optimal`'s). How good that is for the step:

- ``τ − gather = Σ_u n_u max(C_u, comm_u) ≥ max_i Φ_i``, with equality when one device
  is the slowest in every unit (one type of device; any devices whose pieces keep
  the same proportions), so there the micro-batches are optimal;
- always ``n_u · max(c_i(u), comm_u) ≤ Φ_i`` for every unit, hence
  ``Σ_u n_u max(C_u, comm_u) ≤ 3 · max_i Φ_i``: the stated bound is 3× (three unit
  kinds); a local search (:func:`_polish`, groups of up to eight device classes) then
  moves samples between classes while the step shortens. Measured against exhaustive
  search with embedding and head up to 8× off the blocks' proportion: within 10 %.

``k`` is tried over the values that change ``⌈B/k⌉`` (four from the least that fits,
then doubling) until a lower bound exceeds the best. Shard vectors come from a small
family: proportional to free memory (shards follow memory), the most even that fits
(water-filling, least communication), their blend, and the most even that fits beside
the micro-batches found; each is solved and the fastest kept. On small clusters
(tests/scheduler/test_fsdp_plan.py) this equals exhaustive search over ``k``,
micro-batches, recomputation modes and the least-communicating shards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ceil_div, ring_allreduce_s
from scheduler.cost.costs import ShardingFigures
from scheduler.cost.profile import DeviceProfile, Profile
from scheduler.errors import PlanError
from scheduler.hardware.cluster import Links
from scheduler.models.activations import RECOMPUTE_MODES, Recompute
from scheduler.planning.plan import DevicePlan, Excluded, Plan, check_global_batch
from scheduler.units import format_bytes

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NUM_UNITS = 3
"""Unit kinds: embedding, block, head (``UNIT_COUNTS`` of each)."""
SUBSETS = [[(s >> u) & 1 for u in range(NUM_UNITS)] for s in range(2**NUM_UNITS)]
"""Which units are compute-bound in each affine piece of ``Φ``."""
CONSECUTIVE_K = 4
"""Accumulation counts tried one by one from the least that fits (those that change
``⌈B/k⌉``: a larger ``k`` with the same one only adds collectives) ..."""
MAX_K_TRIED = 10
"""... then doubling, up to this many in all, until a lower bound exceeds the best."""
BISECTION_STEPS = 100
POLISH_CLASSES = 8
"""Groups with at most this many device classes get the local search of :func:`_polish`."""
POLISH_ROUNDS = 8


def sharding_of_profile(profile: Profile) -> ShardingFigures:
    if profile.sharding is None:
        raise PlanError(
            f"profile: model {profile.model!r} has no sharding figures ('sharding'); "
            "fsdp plans need them: re-profile, or use a known preset"
        )
    return profile.sharding


# --- devices as arrays ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Classes:
    """Devices with identical figures, as arrays over classes (the search's form).

    Rows of ``fixed_s``/``per_sample_s`` are recomputation modes
    (:data:`RECOMPUTE_MODES`), then unit kinds, then classes."""

    counts: IntArray
    capacity: FloatArray
    fixed_s: FloatArray
    """(modes, units, classes) seconds per micro-batch."""
    per_sample_s: FloatArray
    act_bytes: FloatArray
    """(modes, classes) activation bytes per sample of the whole model; ``inf``: no such mode."""
    limit: FloatArray
    """(modes, classes) largest micro-batch measured to fit (``inf``: no limit)."""

    @property
    def least_act(self) -> FloatArray:
        out: FloatArray = self.act_bytes.min(axis=0)
        return out


def _unit_figures(d: DeviceProfile, num_blocks: int) -> list[tuple[float, ...] | None]:
    """Per mode: fixed then per-sample seconds of the embedding, a block and the head,
    from the device's per-layer figures (the embedding and head run plain whatever the
    blocks do); a device without them: the whole model spread over the blocks."""
    rows: list[tuple[float, ...] | None] = [None] * len(RECOMPUTE_MODES)
    if d.layers is not None:
        e, h = d.layers.embed, d.layers.head
        for o in d.layers.block.options():
            rows[RECOMPUTE_MODES.index(o.recompute)] = (
                e.fixed_s,
                o.fixed_s,
                h.fixed_s,
                e.per_sample_s,
                o.per_sample_s,
                h.per_sample_s,
            )
        return rows
    for o in d.options():
        rows[RECOMPUTE_MODES.index(o.recompute)] = (
            0.0,
            o.fixed_s / num_blocks,
            0.0,
            0.0,
            o.per_sample_s / num_blocks,
            0.0,
        )
    return rows


def _device_row(d: DeviceProfile, num_blocks: int) -> list[float]:
    """Every figure the search reads of ``d``, flat (a class is a set of equal rows)."""
    row = [float(d.capacity_bytes)]
    options = {o.recompute: o for o in d.options()}
    for mode, times in zip(RECOMPUTE_MODES, _unit_figures(d, num_blocks), strict=True):
        option = options.get(mode)
        if option is None or times is None:
            row += [math.inf, math.inf, *(0.0,) * 6]
            continue
        limit = math.inf
        if d.micro_batch_limit is not None:
            limit = float(d.micro_batch_limit)
            if 0 < option.per_sample_bytes < d.per_sample_bytes:
                limit = float(d.micro_batch_limit * d.per_sample_bytes // option.per_sample_bytes)
        row += [float(option.per_sample_bytes), limit, *times]
    return row


def classes_of(devices: Sequence[DeviceProfile], num_blocks: int) -> tuple[Classes, IntArray]:
    """The classes of ``devices`` and each device's class index."""
    seen: dict[tuple[object, ...], list[float]] = {}  # devices of one type repeat their figures
    rows_list = []
    for d in devices:
        key = (
            d.capacity_bytes,
            d.layers,
            d.fixed_s,
            d.per_sample_s,
            d.per_sample_bytes,
            d.selective,
            d.full,
            d.micro_batch_limit,
        )
        row = seen.get(key)
        if row is None:
            row = seen[key] = _device_row(d, num_blocks)
        rows_list.append(row)
    rows = np.array(rows_list, dtype=np.float64)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    inverse = np.asarray(inverse, dtype=np.int64).reshape(-1)
    counts = np.bincount(inverse, minlength=len(unique)).astype(np.int64)
    r = len(RECOMPUTE_MODES)
    per_mode = unique[:, 1:].reshape(len(unique), r, 8)  # (classes, modes, 8)
    act = per_mode[:, :, 0].T
    limit = per_mode[:, :, 1].T
    fixed = per_mode[:, :, [2, 3, 4]].transpose(1, 2, 0)
    per_sample = per_mode[:, :, [5, 6, 7]].transpose(1, 2, 0)
    return (
        Classes(
            counts=counts,
            capacity=unique[:, 0].copy(),
            fixed_s=np.ascontiguousarray(fixed),
            per_sample_s=np.ascontiguousarray(per_sample),
            act_bytes=np.ascontiguousarray(act),
            limit=np.ascontiguousarray(limit),
        ),
        inverse,
    )


# --- collectives -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Collectives:
    """A group's collectives per micro-batch at largest shard ``theta``."""

    comm_s: FloatArray
    """Per unit kind: two all-gathers and one reduce-scatter (s)."""
    first_gather_s: float
    gathered_bytes: float
    """In flight on every rank: two gathered copies and one unsharded gradient."""


def unit_counts(sf: ShardingFigures) -> FloatArray:
    return np.array([1.0, float(sf.num_blocks), 1.0])


def collectives(sf: ShardingFigures, num_ranks: int, theta: float, link_gbps: float) -> Collectives:
    """Per-unit collective time over ``num_ranks`` and the gathered bytes (module docstring)."""
    numel = np.array([sf.embed_numel, sf.block_numel, sf.gathered_head_numel], dtype=np.float64)
    bytes_per_s = link_gbps * 1e9 / 8
    steps = num_ranks - 1
    latency = sf.collective_latency_s if num_ranks > 1 else 0.0
    gather = steps * theta * numel * sf.gather_bytes_per_element / bytes_per_s + latency
    scatter = steps * theta * numel * sf.grad_bytes_per_element / bytes_per_s + latency
    return Collectives(
        comm_s=2 * gather + scatter,
        first_gather_s=float(gather[0]),
        gathered_bytes=gathered_bytes(sf, num_ranks, theta),
    )


def gathered_bytes(sf: ShardingFigures, num_ranks: int, theta: float) -> float:
    """Two gathered copies and one unsharded gradient of the largest unit; padded
    collectives hold ``ranks × largest shard`` elements of each."""
    largest = max(sf.embed_numel, sf.block_numel, sf.gathered_head_numel)
    held = num_ranks * math.ceil(theta * largest) if sf.padded_collectives else largest
    return max(held, largest) * (2 * sf.gather_bytes_per_element + sf.grad_bytes_per_element)


# --- the search for one shard vector ------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Solution:
    """The best ``k`` and micro-batches for one group and shard vector."""

    shards: FloatArray
    """Per class."""
    accum_steps: int
    micro: IntArray
    """Per class: the largest micro-batch (members may be trimmed, :func:`expand`)."""
    modes: IntArray
    step_s: float
    compute_s: float
    comm: Collectives


@dataclass(frozen=True, kw_only=True, slots=True)
class Pieces:
    """``Φ`` of every mode and class as the maximum of eight affine pieces, one per subset
    of units that are compute-bound: ``Φ(m) = max_S (a_S + m·p_S)``, (subsets, modes, classes)."""

    a: FloatArray
    p: FloatArray
    lead: FloatArray
    """``a`` where ``p > 0``, else a huge negative number (no bound on ``m``)."""
    inv: FloatArray
    """``1/p`` where ``p > 0``, else 1."""
    floor_s: FloatArray
    """(modes, classes): the pieces with ``p = 0`` (``Φ`` never drops below them)."""

    @classmethod
    def of(cls, cl: Classes, comm_s: FloatArray, counts: FloatArray) -> Pieces:
        a, p = [], []
        for subset in SUBSETS:
            on = np.array(subset, dtype=np.float64)[None, :, None]
            weights = counts[None, :, None]
            a.append((weights * (on * cl.fixed_s + (1 - on) * comm_s[None, :, None])).sum(1))
            p.append((weights * on * cl.per_sample_s).sum(1))
        aa, pp = np.array(a), np.array(p)
        sloped = pp > 0
        return cls(
            a=aa,
            p=pp,
            lead=np.where(sloped, aa, -1e300),
            inv=np.where(sloped, 1.0 / np.where(sloped, pp, 1.0), 1.0),
            floor_s=np.where(sloped, -np.inf, aa).max(axis=0),
        )

    def phi(self, m: FloatArray) -> FloatArray:
        out: FloatArray = (self.a + m * self.p).max(axis=0)
        return out

    def caps(self, t: float, mem: FloatArray) -> FloatArray:
        """Largest ``m`` per mode and class with ``Φ(m) ≤ t`` within memory ``mem``."""
        # 1e-9: ``Φ(m)`` inverted in floating point must give back ``m``, not ``m − ε``
        each = np.floor((t - self.lead) * self.inv + 1e-9).min(axis=0)
        caps: FloatArray = np.where(t >= self.floor_s, np.maximum(np.minimum(each, mem), 0), 0)
        return caps


def _mem_caps(
    cl: Classes, shards: FloatArray, sf: ShardingFigures, comm: Collectives
) -> FloatArray:
    """Largest micro-batch per mode and class within memory beside its shard and buffers."""
    free = (
        cl.capacity - shards * sf.shardable_state_bytes - sf.unsharded_bytes - comm.gathered_bytes
    )
    with np.errstate(invalid="ignore"):
        caps = np.floor(np.where(free[None, :] >= 0, free[None, :] / cl.act_bytes, 0.0))
    caps = np.minimum(np.nan_to_num(caps, nan=0.0, posinf=0.0), cl.limit)
    out: FloatArray = np.where(np.isfinite(cl.act_bytes), caps, 0.0)
    return out


def _evaluate(
    cl: Classes, micro: FloatArray, modes: IntArray, comm: Collectives, counts: FloatArray, k: int
) -> tuple[float, float]:
    """``(step_s, compute_s)`` of ``k`` micro-batches of at most ``micro`` (module docstring)."""
    cols = np.arange(len(micro))
    busy = cl.fixed_s[modes, :, cols] + micro[:, None] * cl.per_sample_s[modes, :, cols]
    busy = np.where(micro[:, None] > 0, busy, 0.0)
    slowest = busy.max(axis=0)
    per_micro = comm.first_gather_s + float((counts * np.maximum(slowest, comm.comm_s)).sum())
    return k * per_micro, k * float((counts * slowest).sum())


def _best_modes(pieces: Pieces, mem: FloatArray, micro: FloatArray) -> IntArray:
    phi = np.where(mem >= micro[None, :], pieces.phi(micro[None, :]), np.inf)
    modes: IntArray = phi.argmin(axis=0)
    return modes


def _split(cl: Classes, pieces: Pieces, mem: FloatArray, per_micro: int) -> FloatArray | None:
    """Micro-batch per class (every member at most) minimising ``max Φ`` with
    ``Σ m ≥ per_micro``: the least budget ``t`` whose caps add up, by bisection.

    The caps are step functions of ``t``, right-continuous, so at the bracket's upper
    end (adjacent floats, or a relative 1e-12) they are those of the optimum ``t*``."""
    counts = cl.counts.astype(np.float64)
    top = np.minimum(mem.max(axis=0), per_micro)
    if float(top @ counts) < per_micro:
        return None
    phi_top = np.where(mem >= top, pieces.phi(top), np.inf).min(axis=0)
    lo, hi = 0.0, float(np.where(top > 0, phi_top, 0.0).max())
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi or hi - lo <= 1e-12 * hi:
            break
        if float(np.minimum(pieces.caps(mid, mem).max(axis=0), per_micro) @ counts) >= per_micro:
            hi = mid
        else:
            lo = mid
    caps: FloatArray = np.minimum(pieces.caps(hi, mem).max(axis=0), per_micro)
    # a cap past t* (a breakpoint inside the last bracket) is handed back, slowest first
    extra = float(caps @ counts) - per_micro
    if extra > 0:
        phi = np.where(mem >= caps, pieces.phi(caps), np.inf).min(axis=0)
        for c in np.argsort(-phi).tolist():
            while caps[c] > 0 and extra >= counts[c]:
                caps[c] -= 1
                extra -= counts[c]
    return caps


def _polish(
    cl: Classes,
    pieces: Pieces,
    mem: FloatArray,
    micro: FloatArray,
    comm: Collectives,
    *,
    units: FloatArray,
    k: int,
    per_micro: int,
) -> FloatArray:
    """Moves of one sample per member from one class to another while the step shortens.

    The bisection minimises the slowest device over all units; the step takes the
    slowest per unit, which another device may set when pieces differ in proportion
    (module docstring). Small groups of classes only: a pass is quadratic in them."""
    num = len(micro)
    if num < 2 or num > POLISH_CLASSES:
        return micro
    counts = cl.counts.astype(np.float64)
    top = mem.max(axis=0)

    def cost(m: FloatArray) -> float:
        return _evaluate(cl, m, _best_modes(pieces, mem, m), comm, units, k)[0]

    best = cost(micro)
    for _ in range(POLISH_ROUNDS):
        improved = False
        for c in range(num):
            if micro[c] <= 0:
                continue
            for d in range(num):
                if d == c:
                    continue
                trial = micro.copy()
                trial[c] -= 1
                short = per_micro - float(trial @ counts)
                if short > 0:
                    trial[d] += math.ceil(short / counts[d])
                if trial[d] > top[d]:
                    continue
                step = cost(trial)
                if step < best * (1 - 1e-12):
                    micro, best, improved = trial, step, True
        if not improved:
            break
    return micro


def solve_group(
    cl: Classes,
    shards: FloatArray,
    sf: ShardingFigures,
    *,
    num_ranks: int,
    link_gbps: float,
    global_batch: int,
) -> Solution | None:
    """The fastest ``k`` and micro-batches for shard vector ``shards`` (per class)."""
    theta = float(shards[cl.counts > 0].max())
    comm = collectives(sf, num_ranks, theta, link_gbps)
    counts = unit_counts(sf)
    mem = _mem_caps(cl, shards, sf, comm)
    if np.any(
        cl.capacity - shards * sf.shardable_state_bytes - sf.unsharded_bytes < comm.gathered_bytes
    ):
        return None
    room = float((mem.max(axis=0) * cl.counts).sum())
    if room < 1:
        return None
    pieces = Pieces.of(cl, comm.comm_s, counts)
    floor_s = comm.first_gather_s + float(
        (
            counts
            * np.maximum(
                comm.comm_s, np.nanmin(np.where(cl.counts > 0, cl.fixed_s.min(0), np.inf), axis=1)
            )
        ).sum()
    )
    best: Solution | None = None
    k = ceil_div(global_batch, int(min(room, global_batch)))
    tried = 0
    while k <= global_batch and tried < MAX_K_TRIED:
        per_micro = ceil_div(global_batch, k)
        if best is not None and k * floor_s >= best.step_s:
            break
        micro = _split(cl, pieces, mem, per_micro)
        if micro is not None and float(micro @ cl.counts) >= per_micro:
            micro = _polish(cl, pieces, mem, micro, comm, units=counts, k=k, per_micro=per_micro)
            modes = _best_modes(pieces, mem, micro)
            step, compute = _evaluate(cl, micro, modes, comm, counts, k)
            if best is None or step < best.step_s:
                best = Solution(
                    shards=shards,
                    accum_steps=k,
                    micro=micro.astype(np.int64),
                    modes=modes,
                    step_s=step,
                    compute_s=compute,
                    comm=comm,
                )
        tried += 1
        if per_micro == 1:
            break
        # the next k with a smaller ⌈B/k⌉, then doubling
        k = ceil_div(global_batch, per_micro - 1) if tried < CONSECUTIVE_K else 2 * k
    return best


# --- shard vectors -----------------------------------------------------------------


def _rooms(
    cl: Classes, sf: ShardingFigures, num_ranks: int, theta: float, link: float, act: FloatArray
) -> FloatArray:
    held = gathered_bytes(sf, num_ranks, theta)
    out: FloatArray = cl.capacity - sf.unsharded_bytes - held - act
    return out


def proportional_shards(
    cl: Classes, sf: ShardingFigures, num_ranks: int, link: float, act: FloatArray
) -> FloatArray | None:
    """Shards in proportion to the memory left after buffers and ``act`` (shards follow memory)."""
    theta = 1.0 / num_ranks
    shards = None
    for _ in range(6):  # padded gathers grow with the largest shard: a few fixed-point rounds
        room = np.clip(_rooms(cl, sf, num_ranks, theta, link, act), 0, None)
        total = float((room * cl.counts).sum())
        if total <= 0:
            return None
        shards = room / total
        theta = float(shards[cl.counts > 0].max())
    if shards is None:
        return None
    room = _rooms(cl, sf, num_ranks, theta, link, act)
    if np.any(shards * sf.shardable_state_bytes > room + 1e-6):
        return None
    return shards


def even_shards(
    cl: Classes, sf: ShardingFigures, num_ranks: int, link: float, act: FloatArray
) -> FloatArray | None:
    """The most even shards that fit beside ``act``: least ``θ`` with ``Σ min(θ, room/S) ≥ 1``.

    ``Σ_i min(θ, room_i(θ)/S)`` is concave in ``θ`` (a minimum of two lines per device,
    the room shrinking linearly with padded gathers), so the feasible ``θ`` form an
    interval: its peak is found by ternary search and its left end by bisection."""
    states = float(sf.shardable_state_bytes)

    def held(theta: float) -> float:
        share = np.minimum(theta, _rooms(cl, sf, num_ranks, theta, link, act) / states)
        return float((np.clip(share, 0, None) * cl.counts).sum())

    lo, hi = 1.0 / num_ranks, 1.0
    peak = hi
    for _ in range(60 if sf.padded_collectives else 0):  # without padding: increasing
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if held(m1) < held(m2):
            lo = m1
        else:
            hi = m2
        peak = (lo + hi) / 2
    if held(peak) < 1 - 1e-12:
        return None
    lo, hi = 1.0 / num_ranks, peak
    if held(lo) >= 1:
        hi = lo
    for _ in range(40):
        mid = (lo + hi) / 2
        if held(mid) >= 1:
            hi = mid
        else:
            lo = mid
    share = np.clip(np.minimum(hi, _rooms(cl, sf, num_ranks, hi, link, act) / states), 0, None)
    out: FloatArray = share / float((share * cl.counts).sum())
    return out


def best_for_group(
    cl: Classes,
    sf: ShardingFigures,
    *,
    num_ranks: int,
    link_gbps: float,
    global_batch: int,
) -> Solution | None:
    """The fastest solution over the shard family (module docstring)."""
    one = cl.least_act
    args = (cl, sf, num_ranks, link_gbps)
    starts = [
        s for s in (proportional_shards(*args, one), even_shards(*args, one)) if s is not None
    ]
    if len(starts) == 2:
        starts.append((starts[0] + starts[1]) / 2)
    solutions = []
    for shards in starts:
        sol = solve_group(
            cl, shards, sf, num_ranks=num_ranks, link_gbps=link_gbps, global_batch=global_batch
        )
        if sol is None:
            continue
        solutions.append(sol)
        # the most even shards beside the micro-batches found: less to gather, same compute
        cols = np.arange(len(sol.micro))
        per_sample = cl.act_bytes[sol.modes, cols]
        act = sol.micro.astype(np.float64) * np.where(np.isfinite(per_sample), per_sample, 0.0)
        tighter = even_shards(*args, act)
        if tighter is not None:
            again = solve_group(
                cl, tighter, sf, num_ranks=num_ranks, link_gbps=link_gbps, global_batch=global_batch
            )
            if again is not None:
                solutions.append(again)
    return min(solutions, key=lambda s: s.step_s, default=None)


# --- plans -------------------------------------------------------------------------


def _link(links: Links, devices: Sequence[DeviceProfile]) -> float:
    return links.intra_node_gbps if len({d.node for d in devices}) == 1 else links.inter_node_gbps


def expand(sol: Solution, classes: IntArray, global_batch: int) -> tuple[list[int], list[int]]:
    """Samples and largest micro-batch per device: ``k·m`` each, the excess over the batch
    taken off the devices of the slowest classes first (their micro-batches never grow)."""
    k = sol.accum_steps
    micro = sol.micro[classes]
    samples = (k * micro).tolist()
    excess = sum(samples) - global_batch
    order = sorted(range(len(samples)), key=lambda i: -float(micro[i]))
    for i in order:
        if excess <= 0:
            break
        take = min(excess, samples[i])
        samples[i] -= take
        excess -= take
    return samples, [ceil_div(n, k) if n else 0 for n in samples]


def exclusion(d: DeviceProfile, sf: ShardingFigures, held: float) -> str | None:
    """Why ``d`` cannot take part: ``held`` (the gathered units at even shards) and one
    sample do not fit."""
    least = min(d.options(), key=lambda o: o.per_sample_bytes)
    need = held + sf.unsharded_bytes + least.per_sample_bytes
    if need <= d.capacity_bytes:
        return None
    how = f" with {least.recompute} recomputation" if least.recompute != "none" else ""
    return (
        f"two gathered units and one unsharded gradient {format_bytes(int(held))} + one sample "
        f"{format_bytes(least.per_sample_bytes)}{how} exceed capacity "
        f"{format_bytes(d.capacity_bytes)}"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupPlan:
    """One sharding group's devices (in rank order), its solution and each device's part."""

    devices: tuple[DeviceProfile, ...]
    solution: Solution
    samples: list[int]
    micro: list[int]
    classes: IntArray
    """Each device's class in ``cl``."""
    cl: Classes

    def times(self, sf: ShardingFigures) -> tuple[float, float]:
        """``(step_s, compute_s)`` with every device's own micro-batch (after trimming)."""
        sol = self.solution
        return _evaluate(
            _per_device(self.cl, self.classes),
            np.array(self.micro, dtype=np.float64),
            sol.modes[self.classes],
            sol.comm,
            unit_counts(sf),
            sol.accum_steps,
        )


def plan_group(
    devices: Sequence[DeviceProfile], sf: ShardingFigures, links: Links, global_batch: int
) -> GroupPlan | None:
    cl, inverse = classes_of(devices, sf.num_blocks)
    sol = best_for_group(
        cl, sf, num_ranks=len(devices), link_gbps=_link(links, devices), global_batch=global_batch
    )
    if sol is None:
        return None
    samples, micro = expand(sol, inverse, global_batch)
    return GroupPlan(
        devices=tuple(devices), solution=sol, samples=samples, micro=micro, classes=inverse, cl=cl
    )


def entries(
    group: GroupPlan, sf: ShardingFigures, *, offset: int, shard_group: int | None
) -> list[DevicePlan]:
    """The plan entries of one group's devices, in rank order."""
    sol, cl, c = group.solution, group.cl, group.classes
    k = sol.accum_steps
    micro = np.array(group.micro, dtype=np.float64)
    modes = sol.modes[c]
    busy = k * (
        unit_counts(sf)[:, None]
        * (cl.fixed_s[modes, :, c] + micro[:, None] * cl.per_sample_s[modes, :, c]).T
    ).sum(axis=0)
    act = np.where(micro > 0, cl.act_bytes[modes, c], 0.0)
    shards = np.minimum(sol.shards[c], 1.0)
    fixed = sf.unsharded_bytes + sol.comm.gathered_bytes
    peak = np.ceil(shards * sf.shardable_state_bytes + fixed + micro * act)
    offsets = offset + np.cumsum(group.samples) - np.array(group.samples)
    out = []
    for d, n, m, mode, b, pk, o, f in zip(
        group.devices,
        group.samples,
        group.micro,
        modes.tolist(),
        np.where(micro > 0, busy, 0.0).tolist(),
        peak.tolist(),
        offsets.tolist(),
        shards.tolist(),
        strict=True,
    ):
        out.append(
            DevicePlan(
                id=d.id,
                samples=n,
                micro_batch=m,
                accum_steps=k,
                busy_s=b,
                peak_bytes=int(pk),
                offset=int(o),
                recompute=RECOMPUTE_MODES[mode] if m > 0 else "none",
                shard=f,
                shard_group=shard_group,
            )
        )
    return out


def _node_groups(devices: Sequence[DeviceProfile]) -> list[list[DeviceProfile]] | None:
    """Nodes as HSDP groups when they are alike (same figures rank for rank), else None."""
    nodes: dict[str, list[DeviceProfile]] = {}
    for d in devices:
        nodes.setdefault(d.node, []).append(d)
    groups = list(nodes.values())
    if len(groups) < 2 or len({len(g) for g in groups}) != 1:
        return None
    key = [sorted((d.capacity_bytes, d.type, d.fixed_s, d.per_sample_s) for d in g) for g in groups]
    if any(k != key[0] for k in key[1:]):
        return None
    return [
        sorted(g, key=lambda d: (d.capacity_bytes, d.type, d.fixed_s, d.per_sample_s, d.id))
        for g in groups
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    name: str
    groups: list[GroupPlan]
    step_s: float
    compute_s: float
    sync_s: float = 0.0


def _hsdp(
    usable: Sequence[DeviceProfile], sf: ShardingFigures, links: Links, global_batch: int
) -> Candidate | None:
    groups = _node_groups(usable)
    if groups is None or global_batch < len(groups):
        return None
    per_group = ceil_div(global_batch, len(groups))
    template = plan_group(groups[0], sf, links, per_group)
    if template is None:
        return None
    plans = []
    left = global_batch
    for i, g in enumerate(groups):
        batch = min(per_group, left - (len(groups) - 1 - i))
        left -= batch
        samples, micro = expand(template.solution, template.classes, batch)
        plans.append(
            GroupPlan(
                devices=tuple(g),
                solution=template.solution,
                samples=samples,
                micro=micro,
                classes=template.classes,
                cl=template.cl,
            )
        )
    sync = cross_group_s(sf, links, len(groups), float(template.solution.shards.max()))
    step, compute = max(g.times(sf) for g in plans)
    return Candidate(name="hsdp", groups=plans, step_s=step + sync, compute_s=compute, sync_s=sync)


def _flat(
    devices: Sequence[DeviceProfile],
    sf: ShardingFigures,
    links: Links,
    global_batch: int,
    name: str,
) -> Candidate | None:
    group = plan_group(devices, sf, links, global_batch)
    if group is None:
        return None
    step, compute = group.times(sf)
    return Candidate(name=name, groups=[group], step_s=step, compute_s=compute)


def _no_fit(usable: Sequence[DeviceProfile], sf: ShardingFigures, links: Links) -> str:
    n = len(usable)
    held = collectives(sf, n, 1.0 / n, _link(links, usable)).gathered_bytes
    free = sum(
        d.capacity_bytes - held - sf.unsharded_bytes - min(o.per_sample_bytes for o in d.options())
        for d in usable
    )
    return (
        f"fsdp: model states {format_bytes(sf.shardable_state_bytes)} do not fit {n} devices: "
        f"{format_bytes(int(max(free, 0)))} left in all after each holds two gathered units, "
        "one unsharded gradient and one sample"
    )


def plan_fsdp(profile: Profile, global_batch: int) -> Plan:
    """Shards, samples, micro-batches and accumulation for every device (module docstring).

    Candidates: one sharding group over every device that fits; one group per node
    (HSDP) when the nodes are alike; the fastest node alone when it holds the model.
    The fastest predicted is kept and the others named in the notes."""
    check_global_batch(global_batch)
    sf = sharding_of_profile(profile)
    devices = list(profile.devices)
    held = gathered_bytes(sf, len(devices), 1.0 / len(devices))
    excluded: list[Excluded] = []
    usable = []
    for d in devices:
        reason = exclusion(d, sf, held)
        if reason is None:
            usable.append(d)
        else:
            excluded.append(Excluded(id=d.id, reason=reason))
    if not usable:
        raise PlanError(
            "fsdp: no device fits: " + "; ".join(f"{e.id}: {e.reason}" for e in excluded[:3])
        )
    states = sf.shardable_state_bytes
    candidates = [
        c
        for c in (
            _flat(usable, sf, profile.links, global_batch, f"fsdp, one group of {len(usable)}"),
            _hsdp(usable, sf, profile.links, global_batch),
        )
        if c is not None
    ]
    if len({d.node for d in usable}) > 1:
        # the fastest node that could hold the states alone: intra-node collectives
        nodes: dict[str, list[DeviceProfile]] = {}
        for d in usable:
            nodes.setdefault(d.node, []).append(d)
        roomy = [ds for ds in nodes.values() if sum(d.capacity_bytes for d in ds) > states]
        if roomy:
            fastest = max(roomy, key=lambda ds: sum(1 / d.per_sample_s for d in ds))
            name = f"fsdp on {fastest[0].node} alone"
            if (c := _flat(fastest, sf, profile.links, global_batch, name)) is not None:
                candidates.append(c)
    if not candidates:
        raise PlanError(_no_fit(usable, sf, profile.links))
    best = min(candidates, key=lambda c: c.step_s)
    return _to_plan(best, candidates, usable, excluded, sf, global_batch)


def _to_plan(
    best: Candidate,
    candidates: list[Candidate],
    usable: Sequence[DeviceProfile],
    excluded: list[Excluded],
    sf: ShardingFigures,
    global_batch: int,
) -> Plan:
    hsdp = len(best.groups) > 1
    out: list[DevicePlan] = []
    offset = 0
    for g, group in enumerate(best.groups):
        out += entries(group, sf, offset=offset, shard_group=g if hsdp else None)
        offset += sum(group.samples)
    used = {e.id for e in out}
    excluded = excluded + [
        Excluded(id=d.id, reason=f"idle: {best.name} is predicted faster without it")
        for d in usable
        if d.id not in used
    ]
    sol = best.groups[0].solution
    shards = sorted({round(e.shard or 0.0, 4) for e in out})
    notes = [
        f"fsdp: {'HSDP, ' + str(len(best.groups)) + ' groups (one per node), ' if hsdp else ''}"
        f"{len(best.groups[0].devices)} ranks per group, "
        f"{sol.accum_steps} micro-batch(es) per step, "
        f"shards {shards[0]:.3g} to {shards[-1]:.3g} of every unit, "
        f"collectives {sol.comm.comm_s[1] * 1e3:.3g} ms per block per micro-batch"
        + (f", {best.sync_s:.3g} s cross-group all-reduce per step" if hsdp else ""),
    ]
    others = [c for c in candidates if c is not best]
    if others:
        notes.append(
            "fsdp also considered: " + "; ".join(f"{c.name} {c.step_s:.4g} s/step" for c in others)
        )
    return Plan(
        strategy="fsdp",
        global_batch=global_batch,
        predicted_step_s=best.step_s,
        compute_s=best.compute_s,
        comm_s=best.step_s - best.compute_s,
        devices=tuple(out),
        excluded=tuple(excluded),
        notes=tuple(notes),
    )


def _per_device(cl: Classes, inverse: IntArray) -> Classes:
    """``cl`` with one column per device (its class's figures)."""
    return Classes(
        counts=np.ones(len(inverse), dtype=np.int64),
        capacity=cl.capacity[inverse],
        fixed_s=cl.fixed_s[:, :, inverse],
        per_sample_s=cl.per_sample_s[:, :, inverse],
        act_bytes=cl.act_bytes[:, inverse],
        limit=cl.limit[:, inverse],
    )


def group_step_s(
    devices: Sequence[DeviceProfile],
    sf: ShardingFigures,
    links: Links,
    *,
    micro: Sequence[int],
    recompute: Sequence[Recompute],
    theta: float,
    accum_steps: int,
) -> tuple[float, float]:
    """``(step_s, compute_s)`` of one sharding group running these micro-batches."""
    cl, inverse = classes_of(devices, sf.num_blocks)
    comm = collectives(sf, len(devices), theta, _link(links, devices))
    modes = np.array([RECOMPUTE_MODES.index(r) for r in recompute], dtype=np.int64)
    return _evaluate(
        _per_device(cl, inverse),
        np.array(micro, dtype=np.float64),
        modes,
        comm,
        unit_counts(sf),
        accum_steps,
    )


def cross_group_s(sf: ShardingFigures, links: Links, num_groups: int, theta: float) -> float:
    """HSDP: rank ``j`` of every group all-reduces its slice of the gradients, once a step."""
    size = int(theta * sf.numel * sf.grad_bytes_per_element)
    return ring_allreduce_s(num_groups, size, links.inter_node_gbps)


def predict_fsdp_step_s(plan: Plan, profile: Profile) -> float:
    """Step time of an fsdp plan's shards and split under ``profile`` (re-planning);
    under the profile it was planned with, the plan's own prediction."""
    sf = sharding_of_profile(profile)
    by_id = {d.id: d for d in profile.devices}
    groups: dict[int | None, list[DevicePlan]] = {}
    for e in plan.devices:
        groups.setdefault(e.shard_group, []).append(e)
    slowest = 0.0
    for members in groups.values():
        step, _ = group_step_s(
            [by_id[e.id] for e in members],
            sf,
            profile.links,
            micro=[e.micro_batch for e in members],
            recompute=[e.recompute for e in members],
            theta=max(e.shard or 0.0 for e in members),
            accum_steps=max(e.accum_steps for e in members),
        )
        slowest = max(slowest, step)
    if len(groups) > 1:
        theta = max(e.shard or 0.0 for e in plan.devices)
        slowest += cross_group_s(sf, profile.links, len(groups), theta)
    return slowest
