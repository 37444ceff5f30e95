"""The pipeline stage cost model and the exact partition of blocks over a chain.

A pipeline of ``p`` stages runs ``m`` micro-batches of ``b`` samples under the
1F1B schedule (PipeDream-Flush: Narayanan et al., "Memory-Efficient
Pipeline-Parallel DNN Training", 2021). Stage ``s`` holds blocks ``[first, last)``;
stage 0 also holds the embedding, the last stage the final norm and head.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.cost.costmodel import ring_allreduce_s
from scheduler.cost.costs import DeviceProfile, LayerCost, LayerProfile, Option
from scheduler.cost.profile import Profile
from scheduler.errors import PlanError
from scheduler.hardware.cluster import Links
from scheduler.models.activations import RECOMPUTE_MODES, Recompute
from scheduler.models.presets import PRESETS

INF = math.inf
P2P_LATENCY_S = 1e-3
"""Cost of one point-to-point message besides its bytes, charged to the stage per
micro-batch: a stage exchanges activations and gradients with each neighbour
(receives block it). Gloo on loopback takes 0.3–2 ms a message with Python around
it; NCCL takes tens of µs, so on GPUs this errs towards fewer, larger micro-batches."""

FloatArray = npt.NDArray[np.float64]


# --- the stage cost model --------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Tied:
    """A tied token embedding: the last stage keeps its own copy of the weight."""

    state_bytes: int
    """Model-state bytes of the copy the last stage adds (0 when the profile counts it)."""
    gradient_bytes: int
    """Bytes of its gradient, all-reduced between embedding and head holders each step."""


def tied_embedding(profile: Profile) -> Tied:
    """The tied embedding of ``profile``'s model, or zeros when its head is untied/unknown.

    Measured layer profiles count the head's weight copy in ``head.static_bytes``;
    analytic ones (from the presets) count only the final norm, so the copy is added.
    """
    preset = PRESETS.get(profile.model)
    if preset is None or preset.family != "gpt":
        return Tied(state_bytes=0, gradient_bytes=0)
    params = preset.vocab_size * preset.d_model
    grad_per_param = profile.gradient_bytes / preset.num_params if preset.num_params else 0.0
    state = 16 * params if profile.source == "analytic" else 0
    return Tied(state_bytes=state, gradient_bytes=int(params * grad_per_param))


def _ends(lp: LayerProfile, *, first: bool, last: bool) -> LayerCost:
    """The embedding and/or head a boundary stage holds besides its blocks."""
    pieces = ([lp.embed] if first else []) + ([lp.head] if last else [])
    return LayerCost(
        fixed_s=sum(c.fixed_s for c in pieces),
        per_sample_s=sum(c.per_sample_s for c in pieces),
        static_bytes=sum(c.static_bytes for c in pieces),
        per_sample_bytes=sum(c.per_sample_bytes for c in pieces),
    )


def exchange_s(*, first: bool, last: bool) -> float:
    """Per-micro-batch message latency of a stage: two messages per neighbour.

    >>> exchange_s(first=True, last=True), exchange_s(first=True, last=False)
    (0.0, 0.002)
    """
    neighbours = (0 if first else 1) + (0 if last else 1)
    return 2 * neighbours * P2P_LATENCY_S


def block_option(lp: LayerProfile, recompute: Recompute) -> Option:
    """The block's figures under ``recompute``; PlanError if the profile lacks them."""
    for option in lp.block.options():
        if option.recompute == recompute:
            return option
    raise PlanError(f"profile: no block figures for {recompute} recomputation")


def stage_time_s(
    lp: LayerProfile,
    num_blocks: int,
    micro_batch: int,
    *,
    first: bool,
    last: bool,
    recompute: Recompute = "none",
) -> float:
    """Forward + backward time of one micro-batch on a stage of ``num_blocks`` blocks.

    Per micro-batch, stage ``s`` on device ``d`` takes

        t_s = Σ_pieces (fixed_s + b·per_sample_s) + 2·n_s·latency   (forward + backward)

    from the device's per-layer profile (``n_s`` neighbours, each sending and
    receiving one message per micro-batch: :data:`P2P_LATENCY_S`).
    """
    ends = _ends(lp, first=first, last=last)
    block = block_option(lp, recompute)
    return (
        ends.fixed_s
        + num_blocks * block.fixed_s
        + micro_batch * (ends.per_sample_s + num_blocks * block.per_sample_s)
    )


def stage_bytes(
    lp: LayerProfile,
    num_blocks: int,
    micro_batch: int,
    *,
    in_flight: int,
    first: bool,
    last: bool,
    tied_state_bytes: int = 0,
    recompute: Recompute = "none",
) -> int:
    """Peak memory of a stage: its states plus ``in_flight`` micro-batches' activations,
    plus one block's while it is recomputed.

    A stage needs

        mem_s = Σ_pieces static_bytes + min(p − s, m) · b · Σ_pieces per_sample_bytes

    because under 1F1B stage ``s`` holds the activations of ``min(p − s, m)``
    micro-batches at once: early stages hold more, so the order of devices matters.
    A stage may run its blocks with activation recomputation (the block's
    ``selective`` or ``full`` figures, :mod:`scheduler.models.activations`): less kept
    per block, more time, plus what one block holds while it is recomputed, once
    per stage. Each stage takes, for every block count, the fastest mode that
    fits its memory, so :func:`partition` stays exact over the modes too.
    """
    ends = _ends(lp, first=first, last=last)
    block = block_option(lp, recompute)
    states = ends.static_bytes + num_blocks * lp.block.static_bytes
    if last and not first:
        states += tied_state_bytes
    act = ends.per_sample_bytes + num_blocks * block.per_sample_bytes
    transient = block.transient_bytes_per_sample if num_blocks else 0
    return states + in_flight * micro_batch * act + micro_batch * transient


def layers_of(device: DeviceProfile) -> LayerProfile:
    if device.layers is None:
        raise PlanError(
            f"profile: device {device.id} has no per-layer figures ('layers'); "
            "re-profile, or plan with dp"
        )
    return device.layers


def in_flight_1f1b(num_stages: int, num_micro_batches: int | None) -> list[int]:
    """Micro-batches whose activations stage ``s`` holds at once under 1F1B.

    >>> in_flight_1f1b(4, 8), in_flight_1f1b(4, 2), in_flight_1f1b(3, None)
    ([4, 3, 2, 1], [2, 2, 2, 1], [3, 2, 1])
    """
    m = num_micro_batches if num_micro_batches is not None else num_stages
    return [min(num_stages - s, m) for s in range(num_stages)]


# --- the exact partition for a fixed order ---------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    device: DeviceProfile
    first: int
    last: int
    """Blocks ``[first, last)``."""
    time_s: float
    """Forward + backward of one (largest) micro-batch, plus its messages (:func:`exchange_s`)."""
    peak_bytes: int
    recompute: Recompute = "none"
    """How its blocks keep activations (:func:`stage_bytes`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Chain:
    """A partitioned pipeline: its stages in order and their micro-batch size."""

    stages: tuple[Stage, ...]
    micro_batch: int

    @property
    def slowest_s(self) -> float:
        return max(s.time_s for s in self.stages)

    @property
    def total_s(self) -> float:
        return sum(s.time_s for s in self.stages)

    def compute_s(self, num_micro_batches: int) -> float:
        """1F1B step time without communication.

        ``Σ_s t_s + (m − 1)·max_s t_s``: one micro-batch crosses every stage, the
        other ``m − 1`` leave at the bottleneck's pace; with balanced stages this is
        the familiar ``(m + p − 1)·t``, bubble ``(p − 1)/m`` (Huang et al., GPipe,
        2019). A step adds :func:`boundary_s` (activations forward and their
        gradients backward once over each stage boundary on the fill/drain path;
        later transfers overlap with compute) and, for a tied embedding (GPT),
        :func:`tied_sync_s`.
        """
        if num_micro_batches <= 0:
            return 0.0
        return self.total_s + (num_micro_batches - 1) * self.slowest_s


@functools.lru_cache(maxsize=4096)
def _block_modes(
    block: LayerCost,
) -> tuple[npt.NDArray[np.int64], FloatArray, FloatArray, FloatArray, FloatArray]:
    """A block's modes as columns, less recomputation first (``argmin`` keeps it on ties):
    mode indices, then fixed_s, per_sample_s, kept and transient bytes, each ``(modes, 1)``.
    Memoised by the block's figures (read-only arrays): a plan partitions the same
    figures thousands of times."""
    options = block.options()

    def column(values: list[float]) -> FloatArray:
        out = np.array(values, dtype=np.float64)[:, None]
        out.setflags(write=False)  # shared by every caller of the cache
        return out

    modes = np.array([RECOMPUTE_MODES.index(o.recompute) for o in options], dtype=np.int64)
    modes.setflags(write=False)
    return (
        modes,
        column([o.fixed_s for o in options]),
        column([o.per_sample_s for o in options]),
        column([o.per_sample_bytes for o in options]),
        column([o.transient_bytes_per_sample for o in options]),
    )


def _stage_arrays(
    device: DeviceProfile,
    num_blocks: int,
    micro_batch: int,
    *,
    in_flight: int,
    first: bool,
    last: bool,
    tied_state_bytes: int,
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Time of this stage for 0..num_blocks blocks with its fastest mode that fits memory
    (``∞`` where none does), and that mode's index in :data:`RECOMPUTE_MODES`."""
    lp = layers_of(device)
    modes, fixed, per_sample, kept, transient = _block_modes(lp.block)
    k = np.arange(num_blocks + 1, dtype=np.float64)[None, :]  # (1, K+1)
    ends = _ends(lp, first=first, last=last)
    time = (
        ends.fixed_s
        + k * fixed
        + micro_batch * (ends.per_sample_s + k * per_sample)
        + exchange_s(first=first, last=last)
    )  # (modes, K+1)
    states = ends.static_bytes + k * lp.block.static_bytes
    if last and not first:
        states = states + tied_state_bytes
    mem = (
        states
        + in_flight * micro_batch * (ends.per_sample_bytes + k * kept)
        + micro_batch * np.where(k > 0, transient, 0.0)
    )
    time = np.where(mem > device.capacity_bytes, INF, time)
    chosen = time.argmin(axis=0)
    best = np.asarray(time.min(axis=0), dtype=np.float64)
    mode = modes[chosen]
    if not first and not last:
        best[0] = INF  # a middle stage without blocks would only forward tensors
    return best, mode


StageArrays = tuple[FloatArray, npt.NDArray[np.int64]]
StageKey = tuple[int, int, int, int, bool, bool, int]
"""``(id of a device's layers, its capacity, micro-batch, in flight, first, last, tied
state)``: what a stage's costs depend on besides its blocks."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCache:
    """Memo of stage costs shared by the partitions of one plan: a hybrid plan of 4,096
    devices asks for the same few hundred thousands of times. Keyed by the layers'
    identity, so it must not outlive the profile whose devices filled it."""

    arrays: dict[StageKey, StageArrays] = field(default_factory=dict)
    """:func:`_stage_arrays` by stage key."""
    stages: dict[tuple[StageKey, int, Recompute], tuple[float, int]] = field(default_factory=dict)
    """``(time_s, peak_bytes)`` by stage key, number of blocks and mode."""


def partition(
    devices: Sequence[DeviceProfile],
    *,
    micro_batch: int,
    in_flight: Sequence[int],
    tied_state_bytes: int = 0,
    cache: StageCache | None = None,
) -> Chain | None:
    """Blocks per stage for ``devices`` in this order minimising the slowest stage.

    ``None`` when no split fits memory.

    Exact, by dynamic programming over layers: ``F_s(j) = min_{i ≤ j} max(F_{s−1}(i),
    t_s(j − i))`` where stage ``s`` takes blocks ``[i, j)`` and infeasible ranges
    (memory) cost ``∞`` (the stage DP of PipeDream and Alpa, specialised to a
    chain of identical blocks, so a stage's cost depends only on its block count).
    A second pass takes, among the min-max splits, the one with the least
    ``Σ_s t_s``, which is then exactly optimal for :meth:`Chain.compute_s`
    over the splits that reach the min-max. ``O(p·L²)``, vectorised with NumPy.

    ``cache``: stage costs shared by the partitions of one plan (:class:`StageCache`).
    """
    p = len(devices)
    memo = cache if cache is not None else StageCache()
    num_blocks, arrays, keys = _chain_arrays(
        devices, micro_batch, in_flight, tied_state_bytes, memo
    )
    costs = [time for time, _ in arrays]
    best = _min_max_s(costs, num_blocks)
    if not math.isfinite(best):
        return None
    bounds = _least_total_bounds(costs, best, num_blocks)
    # each stage's fastest mode that fits, by its number of blocks
    modes = [
        RECOMPUTE_MODES[int(mode_by_count[bounds[s + 1] - bounds[s]])]
        for s, (_, mode_by_count) in enumerate(arrays)
    ]
    stages = []
    for s, d in enumerate(devices):
        figures_key = (keys[s], bounds[s + 1] - bounds[s], modes[s])
        figures = memo.stages.get(figures_key)
        if figures is None:
            figures = memo.stages[figures_key] = _stage_figures(
                layers_of(d),
                bounds[s + 1] - bounds[s],
                micro_batch,
                in_flight=in_flight[s],
                first=s == 0,
                last=s == p - 1,
                tied_state_bytes=tied_state_bytes,
                recompute=modes[s],
            )
        stages.append(
            Stage(
                device=d,
                first=bounds[s],
                last=bounds[s + 1],
                time_s=figures[0],
                peak_bytes=figures[1],
                recompute=modes[s],
            )
        )
    return Chain(stages=tuple(stages), micro_batch=micro_batch)


def _chain_arrays(
    devices: Sequence[DeviceProfile],
    micro_batch: int,
    in_flight: Sequence[int],
    tied_state_bytes: int,
    memo: StageCache,
) -> tuple[int, list[StageArrays], list[StageKey]]:
    """The number of blocks, then each stage's :func:`_stage_arrays` and key."""
    p = len(devices)
    num_blocks = layers_of(devices[0]).num_blocks
    for d in devices:
        if layers_of(d).num_blocks != num_blocks:
            raise PlanError(
                f"profile: device {d.id} has {layers_of(d).num_blocks} blocks, "
                f"{devices[0].id} has {num_blocks}"
            )
    arrays, keys = [], []
    for s, d in enumerate(devices):
        key: StageKey = (
            id(layers_of(d)),
            d.capacity_bytes,
            micro_batch,
            in_flight[s],
            s == 0,
            s == p - 1,
            tied_state_bytes,
        )
        keys.append(key)
        found = memo.arrays.get(key)
        if found is None:
            found = _stage_arrays(
                d,
                num_blocks,
                micro_batch,
                in_flight=in_flight[s],
                first=s == 0,
                last=s == p - 1,
                tied_state_bytes=tied_state_bytes,
            )
            memo.arrays[key] = found
        arrays.append(found)
    return num_blocks, arrays, keys


def fits(
    devices: Sequence[DeviceProfile],
    *,
    micro_batch: int,
    in_flight: Sequence[int],
    tied_state_bytes: int = 0,
    cache: StageCache | None = None,
) -> bool:
    """Whether :func:`partition` finds a split of these devices, without solving it.

    A stage fits ``k`` blocks for every ``k`` up to its largest that fits (memory grows
    with ``k`` in every mode), from 0 on the first and last stage and from 1 in the
    middle; some block counts summing to ``L`` fit exactly when each stage fits its
    least and those leasts and largests bracket ``L``."""
    memo = cache if cache is not None else StageCache()
    num_blocks, arrays, _ = _chain_arrays(devices, micro_batch, in_flight, tied_state_bytes, memo)
    least = most = 0
    for s, (time, _) in enumerate(arrays):
        low = 0 if s in (0, len(arrays) - 1) else 1
        finite = np.flatnonzero(np.isfinite(time))
        if not len(finite) or finite[0] > low:
            return False
        least, most = least + low, most + int(finite[-1])
    return least <= num_blocks <= most


@functools.lru_cache(maxsize=64)
def _spans(num_blocks: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Over every pair of boundaries ``(i, j)``: whether ``[i, j)`` is a range, and its
    number of blocks (0 where it is not). Memoised (read-only arrays): every partition
    of a model asks for the same."""
    i_idx, j_idx = np.meshgrid(np.arange(num_blocks + 1), np.arange(num_blocks + 1), indexing="ij")
    span = j_idx - i_idx  # blocks of a stage going from boundary i to boundary j
    valid = span >= 0
    counts = np.where(valid, span, 0)
    valid.setflags(write=False)
    counts.setflags(write=False)
    return valid, counts


def _min_max_s(costs: list[FloatArray], num_blocks: int) -> float:
    """Pass 1: the least possible slowest stage ``T*`` (``inf``: nothing fits)."""
    if len(costs) == 1:
        return float(costs[0][num_blocks])
    valid, span_c = _spans(num_blocks)
    f = np.full(num_blocks + 1, INF)
    f[:] = costs[0]  # stage 0 covers [0, j)
    for cost in costs[1:]:
        c = np.where(valid, cost[span_c], INF)
        f = np.asarray(np.maximum(f[:, None], c).min(axis=0), dtype=np.float64)
    return float(f[num_blocks])


def _least_total_bounds(costs: list[FloatArray], best: float, num_blocks: int) -> list[int]:
    """Pass 2: the stage boundaries of least total time among the splits whose every
    stage is within ``best``."""
    if len(costs) == 1:
        return [0, num_blocks]
    valid, span_c = _spans(num_blocks)
    limit = best * (1 + 1e-12) + 1e-18
    capped = [np.where(c <= limit, c, INF) for c in costs]
    g = capped[0].copy()
    choice: list[npt.NDArray[np.int64]] = []
    for cost in capped[1:]:
        c = np.where(valid, cost[span_c], INF)
        total = g[:, None] + c
        choice.append(np.asarray(total.argmin(axis=0), dtype=np.int64))
        g = np.asarray(total.min(axis=0), dtype=np.float64)
    bounds = [num_blocks]
    for s in range(len(costs) - 1, 0, -1):
        bounds.append(int(choice[s - 1][bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    return bounds


def _stage_figures(
    lp: LayerProfile,
    num: int,
    micro_batch: int,
    *,
    in_flight: int,
    first: bool,
    last: bool,
    tied_state_bytes: int,
    recompute: Recompute,
) -> tuple[float, int]:
    """``(time_s, peak_bytes)`` of a stage of ``num`` blocks (:class:`Stage`)."""
    time_s = stage_time_s(
        lp, num, micro_batch, recompute=recompute, first=first, last=last
    ) + exchange_s(first=first, last=last)
    peak_bytes = stage_bytes(
        lp,
        num,
        micro_batch,
        in_flight=in_flight,
        tied_state_bytes=tied_state_bytes,
        recompute=recompute,
        first=first,
        last=last,
    )
    return time_s, peak_bytes


# --- communication ---------------------------------------------------------


def link_gbps(links: Links, a: DeviceProfile, b: DeviceProfile) -> float:
    if a.node == b.node:
        return links.within(a.node)
    return min(links.card(a.node), links.card(b.node))


def transfer_s(num_bytes: float, gbps: float) -> float:
    return num_bytes * 8 / (gbps * 1e9)


def boundary_s(chain: Chain, links: Links) -> float:
    """Activations forward and gradients backward once across every boundary."""
    total = 0.0
    for a, b in zip(chain.stages, chain.stages[1:], strict=False):
        lp = layers_of(a.device)
        total += 2 * transfer_s(
            chain.micro_batch * lp.boundary_bytes_per_sample, link_gbps(links, a.device, b.device)
        )
    return total


def tied_sync_s(chain: Chain, links: Links, tied: Tied) -> float:
    """All-reduce of the tied embedding gradient between the first and the last stage."""
    if len(chain.stages) < 2 or tied.gradient_bytes == 0:
        return 0.0
    a, b = chain.stages[0].device, chain.stages[-1].device
    return ring_allreduce_s(2, tied.gradient_bytes, link_gbps(links, a, b))
