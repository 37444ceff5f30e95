"""The search of fully-sharded plans: micro-batches, accumulation and shards for one group.

Plans are priced with :mod:`scheduler.cost.sharded`. The search (:func:`solve_group`),
for a shard vector ``f`` and each ``k``: minimise
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
(water-filling, least communication), their blend, the most even that fits beside one
sample on the fastest classes only (the slower ones holding shards and no activations),
and the most even that fits beside the micro-batches found; each is solved and the
fastest kept. On small clusters
(tests/scheduler/test_fsdp_plan.py) this equals exhaustive search over ``k``,
micro-batches, recomputation modes and the least-communicating shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.cost.costmodel import ceil_div
from scheduler.cost.costs import ShardingFigures
from scheduler.cost.sharded import (
    Classes,
    Collectives,
    FloatArray,
    IntArray,
    Pieces,
    collectives,
    evaluate_step,
    gathered_bytes,
    unit_counts,
)

CONSECUTIVE_K = 4
"""Accumulation counts tried one by one from the least that fits (those that change
``⌈B/k⌉``: a larger ``k`` with the same one only adds collectives) ..."""
MAX_K_TRIED = 10
"""... then doubling, up to this many in all, until a lower bound exceeds the best."""
BISECTION_STEPS = 100
POLISH_CLASSES = 8
"""Groups with at most this many device classes get the local search of :func:`_polish`."""
POLISH_ROUNDS = 8
NO_MEMORY_BOUND = float(2**53)
"""The micro-batch cap of a mode that saves no activations (exact in float64)."""


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


def _mem_caps(
    cl: Classes, shards: FloatArray, sf: ShardingFigures, comm: Collectives
) -> FloatArray:
    """Largest micro-batch per mode and class within memory beside its shard and buffers."""
    free = (
        cl.capacity - shards * sf.shardable_state_bytes - sf.unsharded_bytes - comm.gathered_bytes
    )
    act = cl.act_bytes
    room = np.broadcast_to(np.maximum(free, 0.0)[None, :], act.shape)
    # no activations (a profile that says 0 bytes a sample): memory sets no bound
    caps = np.full(act.shape, NO_MEMORY_BOUND)
    np.floor_divide(room, act, out=caps, where=act > 0)
    caps = np.minimum(caps, cl.limit)
    out: FloatArray = np.where(np.isfinite(act) & (free[None, :] >= 0), caps, 0.0)
    return out


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
        return evaluate_step(cl, m, _best_modes(pieces, mem, m), comm, units, k)[0]

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
            step, compute = evaluate_step(cl, micro, modes, comm, counts, k)
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


def _fastest_only_starts(
    cl: Classes, sf: ShardingFigures, num_ranks: int, link_gbps: float
) -> list[FloatArray]:
    """The most even shards beside one sample on the ``j`` fastest classes only, for each
    ``j`` below the number of classes: the slower devices hold shards and take no samples,
    so they reserve no activations and take more of the states, which leaves the fast ones
    room for larger micro-batches. The starts above reserve one sample on every device, and
    the step beside the micro-batches found reaches these shards only from a solution that
    already left the slow devices idle."""
    counts = unit_counts(sf)
    per_sample = np.where(np.isfinite(cl.per_sample_s), cl.per_sample_s, np.inf).min(axis=0)
    order = np.argsort((counts[:, None] * per_sample).sum(axis=0), kind="stable")
    out = []
    for j in range(1, len(order)):
        act = np.zeros_like(cl.least_act)
        act[order[:j]] = cl.least_act[order[:j]]
        shards = even_shards(cl, sf, num_ranks, link_gbps, act)
        if shards is not None:
            out.append(shards)
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
    starts.extend(_fastest_only_starts(*args))
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
