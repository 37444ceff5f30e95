"""Lower bounds on a hybrid plan's step time per micro-batch size, without partitioning.

The hybrid planner (:mod:`scheduler.planning.hybrid`) partitions every pipeline for
every candidate micro-batch size, and at 4,096 devices that was most of its time
(issue 20). A size whose step time cannot come within
:data:`~scheduler.planning.pipeline.LARGER_MICRO_BATCH_MARGIN` of the fastest found
can be neither the fastest nor a near-tie that a larger micro-batch wins, so it is
skipped: sizes are tried in order of their bound and the search stops at the first
bound beyond that margin. The plan is the one the full search finds, exactly.

The bound relaxes what :func:`scheduler.planning.stages.partition` solves. With
micro-batch ``b``, stage ``s`` of a pipeline costs ``e_s + x_s·c_s`` for ``x_s``
blocks: ``e_s`` its embedding/head and message latency, ``c_s`` one block at its
fastest mode's figures. With memory ignored,

- the slowest stage is at least the least ``T_j`` with ``Σ_s ⌊(T − e_s)/c_s⌋ ≥ L``,
  ``T ≥ e_s`` and ``T ≥ e_s + c_s`` on middle stages (any block counts summing to
  ``L`` are contiguous ranges in the chain's order, so without memory limits this is
  the partition's own min-max);
- the sum of stage times is at least ``max(T_j, Σ e_s + L·min_s c_s)``;

so pipeline ``j`` with ``n ≥ 1`` micro-batches takes at least
``g_j(n) = max(T_j, Σ e + L·min c) + (n − 1)·T_j`` plus its boundary transfers, and
the step at least the least slowest ``g_j(n_j)`` over all ways of sharing the ``M``
micro-batches (pipelines that do not fit memory only lower it). Both minima are found
by bisection on the time, vectorised over sizes and pipelines.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ceil_div
from scheduler.cost.costs import LayerCost
from scheduler.cost.profile import DeviceProfile
from scheduler.hardware.cluster import Links
from scheduler.planning.stages import exchange_s, layers_of, link_gbps, transfer_s

FloatArray = npt.NDArray[np.float64]

SAFETY = 1e-9
"""Relative slack taken off every bound, so float rounding never lifts one above the
step time it bounds."""


def _pipeline_figures(group: Sequence[DeviceProfile], links: Links) -> FloatArray:
    """Per stage: ``e`` fixed and per-sample, ``c`` fixed and per-sample; then the
    boundary transfer seconds per sample of the whole pipeline in the last row."""
    p = len(group)
    rows = np.zeros((5, p))
    for s, d in enumerate(group):
        lp = layers_of(d)
        first, last = s == 0, s == p - 1
        ends = ([lp.embed] if first else []) + ([lp.head] if last else [])
        least_fixed, least_per_sample = _least_block(lp.block)
        rows[0, s] = sum(c.fixed_s for c in ends) + exchange_s(first=first, last=last)
        rows[1, s] = sum(c.per_sample_s for c in ends)
        rows[2, s] = least_fixed
        rows[3, s] = least_per_sample
    rows[4, 0] = sum(
        2 * transfer_s(layers_of(a).boundary_bytes_per_sample, link_gbps(links, a, b))
        for a, b in zip(group, group[1:], strict=False)
    )
    return rows


@functools.lru_cache(maxsize=1024)
def _least_block(block: LayerCost) -> tuple[float, float]:
    """The least fixed and the least per-sample seconds of ``block`` over its modes."""
    options = block.options()
    return min(o.fixed_s for o in options), min(o.per_sample_s for o in options)


def _least_slowest_stage(
    e: FloatArray, c: FloatArray, middle: FloatArray, num_blocks: int
) -> FloatArray:
    """Least ``T`` with ``Σ_s ⌊(T − e_s)/c_s⌋ ≥ L``, ``T ≥ e_s`` for every stage and
    ``T ≥ e_s + c_s`` for middle ones, per leading index; stages padded with
    ``c = ∞`` take no block. A lower bound of the result is returned (bisection's
    infeasible end)."""
    need = np.maximum(e.max(axis=-1), np.where(middle > 0, e + c, 0.0).max(axis=-1))
    finite_c = np.where(np.isfinite(c), c, 0.0)
    lo = need * 0.0
    hi = need + num_blocks * np.where(np.isfinite(c), c, np.inf).min(axis=-1)
    for _ in range(64):
        mid = (lo + hi) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            blocks = np.floor((mid[..., None] - e) / c)
        blocks = np.where((finite_c > 0) & (mid[..., None] >= e), blocks, 0.0)
        blocks = np.where((finite_c == 0) & np.isfinite(c), num_blocks, blocks)
        enough = (blocks.sum(axis=-1) >= num_blocks) & (mid >= need)
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    bound: FloatArray = np.maximum(lo, need)
    return bound


def step_lower_bounds(
    groups: Sequence[Sequence[DeviceProfile]],
    global_batch: int,
    sizes: Sequence[int],
    links: Links,
) -> list[float]:
    """A lower bound on the step time of the hybrid plan over ``groups`` (pipelines,
    devices in stage order) for each candidate micro-batch size (module docstring)."""
    num_blocks = layers_of(groups[0][0]).num_blocks
    num_micro = np.array([ceil_div(global_batch, s) for s in sizes], dtype=np.float64)
    micro = np.ceil(global_batch / num_micro)[:, None, None]  # (sizes, 1, 1)
    # identical pipelines (same layers per stage, same links between them) share a column,
    # weighted by how many there are: a type-grouped plan has thousands of one kind
    kinds: dict[tuple[object, ...], int] = {}
    firsts: list[Sequence[DeviceProfile]] = []
    of = []
    for group in groups:
        key = (
            *(id(layers_of(d)) for d in group),
            *(a.node == b.node for a, b in zip(group, group[1:], strict=False)),
        )
        if key not in kinds:
            kinds[key] = len(firsts)
            firsts.append(group)
        of.append(kinds[key])
    weight = np.bincount(np.array(of, dtype=np.int64), minlength=len(firsts)).astype(np.float64)
    longest = max(len(g) for g in firsts)
    figures = np.zeros((5, len(firsts), longest))
    figures[2:4] = np.inf  # padding stages: no block fits them
    middle = np.zeros((len(firsts), longest))
    for j, group in enumerate(firsts):
        figures[:, j, : len(group)] = _pipeline_figures(group, links)
        middle[j, 1 : len(group) - 1] = 1.0
    e = figures[0] + micro * figures[1]  # (sizes, groups, stages)
    c = figures[2] + micro * figures[3]
    slope = _least_slowest_stage(e, c, middle, num_blocks)  # T_j: (sizes, groups)
    least_c = c.min(axis=-1)
    first_cost = e.sum(axis=-1) + num_blocks * least_c + micro[:, :, 0] * figures[4, :, 0]
    first_cost = np.maximum(first_cost, slope)
    # least T with Σ_j count_j(T) ≥ M, count_j(T) = ⌊(T − g_j(1))/T_j⌋ + 1 once T ≥ g_j(1)
    lo = np.zeros(len(sizes))
    hi = (first_cost + (num_micro[:, None] - 1) * slope).min(axis=1)
    for _ in range(100):
        mid = (lo + hi) / 2
        with np.errstate(divide="ignore", invalid="ignore"):  # T_j = 0: unbounded count
            per_pipeline = np.floor((mid[:, None] - first_cost) / slope) + 1
        counts = (np.where(mid[:, None] >= first_cost, per_pipeline, 0.0) * weight).sum(axis=1)
        enough = counts >= num_micro
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    bounds: list[float] = (lo * (1 - SAFETY)).tolist()
    return bounds


def single_pipeline_lower_bound(
    devices: Sequence[DeviceProfile], global_batch: int, sizes: Sequence[int]
) -> float:
    """A lower bound on the step time of every single pipeline over (some of) ``devices``
    with micro-batches of at most one of ``sizes`` (the global batch cut into ``m =
    ⌈B/size⌉`` as equal as integers allow), as
    :func:`scheduler.planning.pipeline.best_pipeline` tries them.

    A pipeline of ``p ≤ L + 2`` stages (a middle stage needs a block) runs ``m``
    micro-batches of ``b`` samples in ``Σ_s t_s + (m − 1)·max_s t_s``. Its ``L`` blocks
    run somewhere, each at least ``c(b) = min_d min_r fixed_r + b·min_r per_sample_r``
    (the fastest device's fastest mode), so ``Σ_s t_s ≥ L·c(b)`` and ``max_s t_s ≥
    L·c(b)/(L + 2)``; communication only adds. Memory is ignored, which only lowers it.
    The hybrid planner skips the single pipeline when this exceeds the fastest grouping:
    at thousands of devices it is slower by orders of magnitude, and searching it was a
    quarter of a 4,096-device plan (issue 20).
    """
    # the fastest block figures of every distinct layer profile (one per kind)
    distinct = {id(d.layers): layers_of(d) for d in devices}.values()
    options = [o for lp in distinct for o in lp.block.options()]
    least_fixed = min(o.fixed_s for o in options)
    least_per_sample = min(o.per_sample_s for o in options)
    num_blocks = layers_of(devices[0]).num_blocks
    bound = math.inf
    for size in sizes:
        num_micro = ceil_div(global_batch, size)
        block = least_fixed + ceil_div(global_batch, num_micro) * least_per_sample
        total = num_blocks * block
        bound = min(bound, total + (num_micro - 1) * total / (num_blocks + 2))
    return bound * (1 - SAFETY)
