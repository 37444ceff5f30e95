"""The fully-sharded (``fsdp``) cost model: a step's time and a device's memory.

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
  into the owned fp32 slice right after its backward. Memory in flight
  (:func:`gathered_bytes`): two gathered parameter copies (the module in use and the
  prefetched next one) and one unsharded gradient (its reduce-scatter in flight) of
  the largest module, plus on gloo the prefetch's staging buffer.
- Collectives run over the slowest link of the group and are priced as rings
  whose every step moves the largest shard: ``(N − 1) · θ · elements · bytes / bandwidth``
  with ``θ = max_i f_i``, plus a latency per collective (``collective_latency_s``:
  about 1 ms on gloo, tens of µs on NCCL). That is exactly gloo's padded collective
  (padding counted) and the largest shard bounds an uneven NCCL one the same way, so uneven shards
  cost communication and the planner only makes them as uneven as memory needs.
  On gloo (``padded_collectives``) an all-gather stages ``N + 1`` slices of ``θ`` ×
  elements (every rank's, padded, and the send) until it completes.
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

Devices with identical figures form one *class* (:func:`classes_of`): a cluster of
thousands of GPUs has a few dozen, and the search (:mod:`scheduler.planning.shards`)
works on those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ring_allreduce_s
from scheduler.cost.costs import DeviceProfile, ShardingFigures
from scheduler.hardware.cluster import Links
from scheduler.models.activations import RECOMPUTE_MODES, Recompute

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NUM_UNITS = 3
"""Unit kinds: embedding, block, head (:func:`unit_counts` of each)."""
SUBSETS = [[(s >> u) & 1 for u in range(NUM_UNITS)] for s in range(2**NUM_UNITS)]
"""Which units are compute-bound in each affine piece of ``Φ`` (:class:`Pieces`)."""


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
    """Per mode: fixed then per-sample seconds of the embedding, a block and the head.

    A rank runs the whole model every micro-batch, so the device's whole-model figures
    (``fixed_s + m·per_sample_s``, measured on the whole pass, and what a simulated
    device is paced to) are its time; the per-layer figures only say how that time
    splits over the units (the embedding and head run plain whatever the blocks do).
    Measured apart, layers miss the whole pass's overhead (on the CPU simulation their
    sum was 0.61 s against 0.82 s for a micro-batch of two), so each of the two sums
    is scaled to the whole model's. Without per-layer figures: the whole model spread
    over the blocks."""
    rows: list[tuple[float, ...] | None] = [None] * len(RECOMPUTE_MODES)
    whole = {o.recompute: o for o in d.options()}
    if d.layers is not None:
        e, h = d.layers.embed, d.layers.head
        for o in d.layers.block.options():
            total = whole.get(o.recompute)
            fixed = np.array([e.fixed_s, o.fixed_s, h.fixed_s])
            per = np.array([e.per_sample_s, o.per_sample_s, h.per_sample_s])
            if total is not None:
                fixed = _scaled(fixed, total.fixed_s, num_blocks)
                per = _scaled(per, total.per_sample_s, num_blocks)
            rows[RECOMPUTE_MODES.index(o.recompute)] = (*fixed.tolist(), *per.tolist())
        return rows
    for o in whole.values():
        rows[RECOMPUTE_MODES.index(o.recompute)] = (
            0.0,
            o.fixed_s / num_blocks,
            0.0,
            0.0,
            o.per_sample_s / num_blocks,
            0.0,
        )
    return rows


def _scaled(parts: FloatArray, total: float, num_blocks: int) -> FloatArray:
    """``parts`` (embedding, one block, head) scaled so that embedding + blocks + head
    add up to ``total``; all on the blocks when the parts add up to nothing."""
    counts = np.array([1.0, float(num_blocks), 1.0])
    now = float(parts @ counts)
    if now > 0:
        out: FloatArray = parts * (total / now)
        return out
    return np.array([0.0, total / num_blocks, 0.0])


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


def per_device(cl: Classes, inverse: IntArray) -> Classes:
    """``cl`` with one column per device (its class's figures)."""
    return Classes(
        counts=np.ones(len(inverse), dtype=np.int64),
        capacity=cl.capacity[inverse],
        fixed_s=cl.fixed_s[:, :, inverse],
        per_sample_s=cl.per_sample_s[:, :, inverse],
        act_bytes=cl.act_bytes[:, inverse],
        limit=cl.limit[:, inverse],
    )


# --- collectives -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Collectives:
    """A group's collectives per micro-batch at largest shard ``theta``."""

    comm_s: FloatArray
    """Per unit kind: two all-gathers and one reduce-scatter (s)."""
    first_gather_s: float
    gathered_bytes: float
    """In flight on every rank at most (:func:`gathered_bytes`)."""


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
    """The most a rank holds beside its shard and activations, as the runtime's schedule
    holds it (:mod:`workers.runtime.shards`): the gathered parameters of the module in use
    and of the next one (prefetch depth 1), the unsharded gradient of the unit whose
    reduce-scatter is in flight, and, on gloo, the staging buffer of the prefetch
    (``ranks + 1`` slots of the largest slice: every rank's slice and the padded send);
    each sized as the largest module (GPT's tied head gathers the embedding's unit)."""
    largest = max(sf.embed_numel, sf.block_numel, sf.gathered_head_numel)
    held = largest * (2 * sf.gather_bytes_per_element + sf.grad_bytes_per_element)
    if not sf.padded_collectives or num_ranks < 2:
        return held
    # +2: a slice cut by rounded cumulative fractions is at most one element past
    # θ·numel, and a module of two units (GPT's head) stages both
    width = math.ceil(theta * largest) + 2
    return held + (num_ranks + 1) * width * sf.gather_bytes_per_element


def link_gbps_of(links: Links, devices: Sequence[DeviceProfile]) -> float:
    """The slowest link of a group: its node's own when all of it is on one node."""
    return links.between(d.node for d in devices)


# --- time -------------------------------------------------------------------------


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


def evaluate_step(
    cl: Classes, micro: FloatArray, modes: IntArray, comm: Collectives, counts: FloatArray, k: int
) -> tuple[float, float]:
    """``(step_s, compute_s)`` of ``k`` micro-batches of at most ``micro`` (module docstring)."""
    cols = np.arange(len(micro))
    busy = cl.fixed_s[modes, :, cols] + micro[:, None] * cl.per_sample_s[modes, :, cols]
    busy = np.where(micro[:, None] > 0, busy, 0.0)
    slowest = busy.max(axis=0)
    per_micro = comm.first_gather_s + float((counts * np.maximum(slowest, comm.comm_s)).sum())
    return k * per_micro, k * float((counts * slowest).sum())


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
    comm = collectives(sf, len(devices), theta, link_gbps_of(links, devices))
    modes = np.array([RECOMPUTE_MODES.index(r) for r in recompute], dtype=np.int64)
    return evaluate_step(
        per_device(cl, inverse),
        np.array(micro, dtype=np.float64),
        modes,
        comm,
        unit_counts(sf),
        accum_steps,
    )


def cross_group_s(sf: ShardingFigures, links: Links, num_groups: int, theta: float) -> float:
    """HSDP: rank ``j`` of every group all-reduces its slice of the gradients, once a step
    (across nodes: priced at the slowest network card)."""
    size = int(theta * sf.numel * sf.grad_bytes_per_element)
    return ring_allreduce_s(num_groups, size, links.slowest_card)
