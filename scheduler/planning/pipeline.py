"""Pipeline plans (``pp``): one chain of devices, uneven contiguous block ranges, 1F1B.

The cost model and the exact partition for a fixed order of devices live in
:mod:`scheduler.planning.stages`; this module chooses the order, the chain and the
micro-batch size (:func:`plan_pp`), and turns the best into a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from scheduler.cost.costmodel import ceil_div
from scheduler.cost.profile import DeviceProfile, Profile
from scheduler.errors import PlanError
from scheduler.hardware.cluster import Links
from scheduler.models.activations import Recompute
from scheduler.planning.plan import DevicePlan, Excluded, Plan, check_global_batch
from scheduler.planning.stages import (
    Chain,
    Tied,
    boundary_s,
    in_flight_1f1b,
    layers_of,
    partition,
    stage_time_s,
    tied_embedding,
    tied_sync_s,
)
from scheduler.units import format_bytes

LARGER_MICRO_BATCH_MARGIN = 0.05
"""Among plans predicted within this share of the fastest, the largest micro-batch wins:
the linear profile does not see that tiny micro-batches run GPUs (and paced CPUs) below
their per-sample rate, nor per-message overheads, so near-ties go to fewer, larger ones."""
MAX_CHAIN_LENGTHS = 12
"""At most this many chain lengths are tried per order (all of them on small clusters)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TimedChoice:
    """A candidate's predicted step: compute and the communication it does not hide."""

    compute_s: float
    comm_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s

    def to_plan(
        self,
        strategy: str,
        global_batch: int,
        *,
        devices: Sequence[DevicePlan],
        excluded: Sequence[Excluded],
        notes: tuple[str, ...],
    ) -> Plan:
        """The plan of this choice: its predicted step, compute and communication."""
        return Plan(
            strategy=strategy,
            global_batch=global_batch,
            predicted_step_s=self.step_s,
            compute_s=self.compute_s,
            comm_s=self.comm_s,
            devices=tuple(devices),
            excluded=tuple(excluded),
            notes=notes,
        )


C = TypeVar("C", bound=TimedChoice)


# --- choosing the chain ----------------------------------------------------


def speed_key(d: DeviceProfile) -> float:
    """Seconds per sample of one block: lower is faster."""
    lp = layers_of(d)
    return lp.block.per_sample_s + lp.block.fixed_s / 64


def candidate_orders(devices: Sequence[DeviceProfile]) -> list[tuple[DeviceProfile, ...]]:
    """The device orders tried (see :func:`plan_pp`), without duplicates."""
    by_memory = sorted(devices, key=lambda d: (-d.capacity_bytes, speed_key(d), d.id))
    node_memory: dict[str, int] = {}
    for d in devices:
        node_memory[d.node] = node_memory.get(d.node, 0) + d.capacity_bytes
    by_node = sorted(
        devices, key=lambda d: (-node_memory[d.node], d.node, -d.capacity_bytes, speed_key(d), d.id)
    )
    by_speed = sorted(devices, key=lambda d: (speed_key(d), -d.capacity_bytes, d.id))
    orders: list[tuple[DeviceProfile, ...]] = []
    for order in (by_memory, by_node, by_speed):
        if tuple(order) not in orders:
            orders.append(tuple(order))
    return orders


def chain_lengths(num_devices: int, num_blocks: int) -> list[int]:
    """Useful pipeline lengths: each middle stage needs a block."""
    top = min(num_devices, num_blocks + 2)
    if top <= MAX_CHAIN_LENGTHS:
        return list(range(1, top + 1))
    picks = {round(top ** (i / (MAX_CHAIN_LENGTHS - 1))) for i in range(MAX_CHAIN_LENGTHS)}
    return sorted(x for x in picks | {1, top} if 1 <= x <= top)


def sub_chains(order: Sequence[DeviceProfile], length: int) -> list[tuple[DeviceProfile, ...]]:
    """The ``length`` fastest and the ``length`` largest devices of ``order``, order kept."""
    out: list[tuple[DeviceProfile, ...]] = []
    for key in (speed_key, lambda d: -d.capacity_bytes):
        chosen = {d.id for d in sorted(order, key=key)[:length]}
        sub = tuple(d for d in order if d.id in chosen)
        if sub not in out:
            out.append(sub)
    return out


def micro_batch_candidates(global_batch: int) -> list[int]:
    """Micro-batch sizes tried: powers of two below the batch, and the batch itself."""
    sizes = {global_batch}
    b = 1
    while b < global_batch:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


def balanced_count(global_batch: int, micro_batch: int) -> tuple[int, int]:
    """``(m, largest micro-batch)``: ``global_batch`` cut into pieces of <= ``micro_batch``."""
    m = ceil_div(global_batch, micro_batch)
    return m, ceil_div(global_batch, m)


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineChoice(TimedChoice):
    chain: Chain
    num_micro_batches: int


def best_pipeline(
    devices: Sequence[DeviceProfile], global_batch: int, *, links: Links, tied: Tied
) -> PipelineChoice | None:
    """The fastest single pipeline over (a subset of) ``devices`` for ``global_batch``."""
    num_blocks = layers_of(devices[0]).num_blocks
    seen: set[tuple[str, ...]] = set()
    choices: list[PipelineChoice] = []
    for order in candidate_orders(devices):
        for length in chain_lengths(len(order), num_blocks):
            for sub in sub_chains(order, length):
                key = tuple(d.id for d in sub)
                if key in seen:
                    continue
                seen.add(key)
                for size in micro_batch_candidates(global_batch):
                    m, micro = balanced_count(global_batch, size)
                    chain = partition(
                        sub,
                        micro_batch=micro,
                        in_flight=in_flight_1f1b(length, m),
                        tied_state_bytes=tied.state_bytes,
                    )
                    if chain is None:
                        continue
                    choice = PipelineChoice(
                        chain=chain,
                        num_micro_batches=m,
                        compute_s=chain.compute_s(m),
                        comm_s=boundary_s(chain, links) + tied_sync_s(chain, links, tied),
                    )
                    choices.append(choice)
    return prefer_larger_micro_batches(choices, lambda c: c.chain.micro_batch)


def prefer_larger_micro_batches(choices: Sequence[C], micro_batch: Callable[[C], int]) -> C | None:
    """The fastest choice, or a larger-micro-batch one within the margin of it."""
    if not choices:
        return None
    fastest = min(c.step_s for c in choices)
    near = [c for c in choices if c.step_s <= fastest * (1 + LARGER_MICRO_BATCH_MARGIN)]
    return max(near, key=lambda c: (micro_batch(c), -c.step_s))


StageBusy = dict[tuple[int, int, Recompute, bool, bool], tuple[float, float]]
"""``(per micro-batch, per sample)`` seconds of a stage by ``(id of its layers, blocks,
recompute, first, last)``: shared by the pipelines of one plan (:func:`stage_plans`)."""


def stage_plans(
    chain: Chain,
    *,
    pipeline: int,
    samples: int,
    num_micro_batches: int,
    offset: int,
    memo: StageBusy | None = None,
) -> list[DevicePlan]:
    """Plan entries of one pipeline's devices (each processes all ``samples``).

    ``memo``: stage figures already computed for this plan's other pipelines (a hybrid
    plan has thousands of like stages); the layers it is keyed by must outlive it."""
    memo = {} if memo is None else memo
    out = []
    for s, st in enumerate(chain.stages):
        lp = layers_of(st.device)
        k = st.last - st.first
        first, last = s == 0, s == len(chain.stages) - 1
        mode = st.recompute
        key = (id(lp), k, mode, first, last)
        figures = memo.get(key)
        if figures is None:
            fixed = stage_time_s(lp, k, 0, recompute=mode, first=first, last=last)
            one = stage_time_s(lp, k, 1, recompute=mode, first=first, last=last)
            figures = memo[key] = (fixed, one)
        fixed, one = figures
        busy = num_micro_batches * fixed + samples * one - samples * fixed
        out.append(
            DevicePlan(
                id=st.device.id,
                samples=samples,
                micro_batch=chain.micro_batch,
                accum_steps=num_micro_batches,
                busy_s=busy,
                peak_bytes=st.peak_bytes,
                offset=offset,
                layers=(st.first, st.last),
                stage=s,
                pipeline=pipeline,
                recompute=mode,
                precision=st.device.precision,
            )
        )
    return out


def exclusion_reason(device: DeviceProfile, tied: Tied) -> str:
    """Why ``device`` is left out of every pipeline."""
    lp = layers_of(device)
    block = min(o.per_sample_bytes + o.transient_bytes_per_sample for o in lp.block.options())
    smallest = min(
        lp.block.static_bytes + block,
        lp.embed.static_bytes + lp.embed.per_sample_bytes,
        lp.head.static_bytes + tied.state_bytes + lp.head.per_sample_bytes,
    )
    if smallest > device.capacity_bytes:
        return (
            f"even the smallest stage piece needs {format_bytes(smallest)} with one sample, "
            f"capacity {format_bytes(device.capacity_bytes)}"
        )
    return "idle: the pipeline is predicted faster without it"


def no_fit_message(devices: Sequence[DeviceProfile], tied: Tied) -> str:
    """Why not even one sample fits a pipeline over all of ``devices``."""
    lp = layers_of(devices[0])
    states = (
        lp.embed.static_bytes
        + lp.num_blocks * lp.block.static_bytes
        + lp.head.static_bytes
        + tied.state_bytes
    )
    least = min(lp.block.options(), key=lambda o: o.per_sample_bytes)
    act = (
        lp.embed.per_sample_bytes
        + lp.num_blocks * least.per_sample_bytes
        + least.transient_bytes_per_sample
        + lp.head.per_sample_bytes
    )
    capacity = sum(d.capacity_bytes for d in devices)
    return (
        f"no pipeline over {len(devices)} devices fits: model states {format_bytes(states)} plus "
        f"{format_bytes(act)} of activations per sample"
        + (f" with {least.recompute} recomputation" if least.recompute != "none" else "")
        + " (held for several micro-batches under 1F1B) "
        f"against {format_bytes(capacity)} of capacity in total, spread over devices that must "
        "each hold whole blocks"
    )


def layer_usable(profile: Profile) -> list[DeviceProfile]:
    usable = [d for d in profile.devices if d.layers is not None]
    if not usable:
        raise PlanError(
            "profile: no device has per-layer figures ('layers'); pipeline plans "
            "need them: re-profile or use an analytic profile"
        )
    return usable


def plan_pp(profile: Profile, global_batch: int) -> Plan:
    """One pipeline, uneven stages, 1F1B.

    Devices are tried in a few orders and the best predicted
    step is kept: (1) memory descending, so the largest devices take the early,
    activation-heavy stages (ties: faster first); (2) grouped by node (nodes by
    total memory, then memory descending inside), so only one boundary crosses
    each node pair and activations travel the fast intra-node links; (3) speed
    descending. For each order the chain may leave devices out: it uses the ``k``
    fastest or the ``k`` largest devices (order kept) for every useful ``k``,
    since a slow stage or a longer bubble can cost more than it brings. Micro-batch
    sizes are tried over powers of two (and the whole batch); the global batch
    is cut into ``m = ceil(B / b)`` micro-batches as equal as integers allow; among
    plans predicted within 5 % of the fastest the one with the largest micro-batches
    is kept (:data:`LARGER_MICRO_BATCH_MARGIN`). Each stage runs its blocks with
    the activation recomputation its partition chose (:mod:`scheduler.planning.stages`);
    the plan entry says which in ``recompute``.
    """
    check_global_batch(global_batch)
    usable = layer_usable(profile)
    tied = tied_embedding(profile)
    choice = best_pipeline(usable, global_batch, links=profile.links, tied=tied)
    if choice is None:
        raise PlanError(no_fit_message(usable, tied))
    entries = stage_plans(
        choice.chain,
        pipeline=0,
        samples=global_batch,
        num_micro_batches=choice.num_micro_batches,
        offset=0,
    )
    used = {e.id for e in entries}
    excluded = [
        Excluded(id=d.id, reason="no per-layer figures in the profile")
        for d in profile.devices
        if d.layers is None
    ]
    excluded += [
        Excluded(id=d.id, reason=exclusion_reason(d, tied)) for d in usable if d.id not in used
    ]
    p, m = len(entries), choice.num_micro_batches
    notes = (
        f"pp: {p} stages, {m} micro-batches of <= {choice.chain.micro_batch}, "
        f"bubble {(p - 1) / m:.0%}, stages "
        + ", ".join(f"{st.device.id} [{st.first},{st.last})" for st in choice.chain.stages),
    )
    return choice.to_plan("pp", global_batch, devices=entries, excluded=excluded, notes=notes)
