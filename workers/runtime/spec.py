"""What a run tells its workers: one run spec, one rank spec per device, one builder.

Every strategy is described by the same two frozen records, which cross Ray as
they are: :class:`RunSpec` and :class:`RankSpec`; :func:`make_ranks` turns any
plan (``dp``, ``even``, ``proportional``, ``pp``, ``hybrid``, ``fsdp``) into rank
specs, and :func:`engine_kind` says which engine runs a rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from scheduler.models.presets import ModelPreset
from scheduler.planning.plan import DP_STRATEGIES, SHARDED_STRATEGIES, DevicePlan, Plan
from workers.devices.layer_profile import host_layers, stage_host
from workers.devices.pacing import Pacing, PacingOf, with_recompute
from workers.errors import WorkerError
from workers.records import OptimizerConfig
from workers.runtime.precision import needs_loss_scaling
from workers.runtime.stages import SyncGroup, ordered_stages, sync_groups

DTYPES = ("float32", "float64")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """What every rank of one run shares: the model, seed, global batch, optimizer,
    data and precision."""

    preset: ModelPreset
    seed: int
    global_batch: int
    optimizer: OptimizerConfig
    dataset: Path | None
    """A text file, or None for the bundled corpus."""
    simulated: bool
    dtype: str = "float32"
    """Parameter and gradient precision; ``float64`` for exact verification runs."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise WorkerError(f"dtype: must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StageRole:
    """A pipeline stage: blocks ``[first, last)`` and the ranks it talks to."""

    first: int
    last: int
    stage: int
    num_stages: int
    prev_rank: int | None
    next_rank: int | None
    groups: tuple[SyncGroup, ...]
    """Every sync group of the run (each rank creates all of them, in one order)."""

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardRole:
    """A fully-sharded rank's place: which sharding group it is in, its position there,
    and every group of the run (global ranks, in rank order; each rank creates every
    group's subgroups, in one order). Position ``j`` of every group owns the same slice
    of each flat space (:func:`scheduler.planning.plan.shard_bounds` of
    :attr:`fractions`), so with several groups (HSDP) the ranks at one position
    replicate each other."""

    group: int
    index: int
    groups: tuple[tuple[int, ...], ...]
    fractions: tuple[float, ...]
    """Every position's share of the flat spaces, in group order (the same in every group)."""

    @property
    def members(self) -> tuple[int, ...]:
        """The global ranks of this rank's sharding group."""
        return self.groups[self.group]

    @property
    def replicas(self) -> tuple[tuple[int, ...], ...]:
        """Per position, the ranks holding that slice across the groups (HSDP)."""
        return tuple(zip(*self.groups, strict=True))


@dataclass(frozen=True, kw_only=True, slots=True)
class RankSpec:
    """One device's part of a run: its rank, its contiguous slice ``[offset, offset +
    samples)`` of every global batch in ``accum_steps`` micro-batches, its pacing
    (simulated devices), and for pipeline plans its :class:`StageRole` (layer range,
    neighbours, the pieces it syncs). A rank without a stage role holds the whole
    model (data parallelism)."""

    device_id: str
    rank: int
    world_size: int
    offset: int
    """First sample of the global batch this rank (its pipeline) computes."""
    samples: int
    micro_batch: int
    accum_steps: int
    capacity_bytes: int = 0
    """Simulated devices' capacity; real GPUs read their own budget."""
    pacing: Pacing | None = None
    """Simulated devices only: host time of what this rank computes, stretched."""
    stage: StageRole | None = None
    """None: the whole model (data parallelism)."""
    recompute: str = "none"
    """Activation recomputation the plan chose for this device (``none``, ``selective``,
    ``full``: :func:`workers.runtime.engine.set_recompute`)."""
    shard: ShardRole | None = None
    """Fully sharded (``fsdp``): the rank's slice of the model states and its groups."""
    precision: str = "fp32"
    """Compute precision the plan chose for this device (:mod:`workers.runtime.precision`)."""
    loss_scaling: bool = False
    """Dynamic loss scaling: True on every rank of a run where any rank computes in fp16."""


_SHARE_FIELDS = ("offset", "samples", "micro_batch", "accum_steps", "recompute", "precision")
"""What a rank takes from its plan entry: its slice of the batch and how it computes it."""


def _share(d: DevicePlan) -> dict[str, Any]:
    return {name: getattr(d, name) for name in _SHARE_FIELDS}


def reshare(ranks: list[RankSpec], plan: Plan) -> list[RankSpec]:
    """The same data-parallel group with ``plan``'s shares (an in-place re-plan).

    A device the new plan gives no samples stays in the group and all-reduces
    zeros, so the group never changes between two steps.
    """
    entries = {d.id: d for d in plan.devices}
    out = []
    for rank in ranks:
        d = entries.get(rank.device_id)
        if d is None or d.samples == 0:
            out.append(replace(rank, offset=0, samples=0, micro_batch=0, accum_steps=0))
        else:
            out.append(replace(rank, **_share(d)))
    return out


EngineKind = Literal["dp", "pipeline", "fsdp"]


def is_sharded(plan: Plan) -> bool:
    return plan.strategy in SHARDED_STRATEGIES or any(d.shard is not None for d in plan.devices)


def needs_pipeline(plan: Plan) -> bool:
    if is_sharded(plan):
        return False
    return plan.strategy not in DP_STRATEGIES or any(d.layers is not None for d in plan.devices)


def engine_kind(rank: RankSpec) -> EngineKind:
    """Which engine runs ``rank``: a pipeline stage, a shard owner, or a whole-model rank."""
    if rank.stage is not None:
        return "pipeline"
    return "fsdp" if rank.shard is not None else "dp"


def make_ranks(
    plan: Plan, *, preset: ModelPreset, pacing_of: PacingOf, cache_dir: Path
) -> list[RankSpec]:
    """The rank specs of ``plan``'s devices: data-parallel, pipeline or fully sharded alike."""
    if not plan.active:
        raise WorkerError("plan: no device has any samples")
    shards: list[ShardRole | None]
    if is_sharded(plan):
        # every device that computes or owns states: one may own states and compute nothing
        devices = [d for d in plan.devices if d.samples > 0 or (d.shard or 0.0) > 0]
        roles: list[tuple[DevicePlan, StageRole | None]] = [(d, None) for d in devices]
        shards = list(shard_roles(devices))
    else:
        roles = (
            _stage_roles(plan, preset) if needs_pipeline(plan) else [(d, None) for d in plan.active]
        )
        shards = [None] * len(roles)
    loss_scaling = needs_loss_scaling(d.precision for d, _ in roles)
    pieces = None
    ranks = []
    for rank, ((d, role), shard) in enumerate(zip(roles, shards, strict=True)):
        capacity, pacing = pacing_of(d.id)
        if pacing is not None and role is not None:  # paced by its own pieces' host time
            if pieces is None:
                pieces = host_layers(preset, pacing.host, cache_dir=cache_dir)
            host = stage_host(
                pieces, num_blocks=role.last - role.first, embed=role.is_first, head=role.is_last
            )
            pacing = replace(pacing, host=host)
        if pacing is not None:
            pacing = with_recompute(pacing, preset, d.recompute)
        ranks.append(
            RankSpec(
                device_id=d.id,
                rank=rank,
                world_size=len(roles),
                capacity_bytes=capacity,
                pacing=pacing,
                stage=role,
                shard=shard,
                loss_scaling=loss_scaling,
                **_share(d),
            )
        )
    return ranks


def _stage_roles(plan: Plan, preset: ModelPreset) -> list[tuple[DevicePlan, StageRole]]:
    """Each active device of a pipeline plan in rank order, with its stage role."""
    stages = ordered_stages(plan)
    groups = tuple(sync_groups(stages, preset))
    num_stages: dict[int, int] = {}
    for d in stages:
        num_stages[d.pipeline or 0] = max(num_stages.get(d.pipeline or 0, 0), (d.stage or 0) + 1)
    roles = []
    for rank, d in enumerate(stages):
        assert d.layers is not None
        p, s = num_stages[d.pipeline or 0], d.stage or 0
        role = StageRole(
            first=d.layers[0],
            last=d.layers[1],
            stage=s,
            num_stages=p,
            prev_rank=rank - 1 if s > 0 else None,
            next_rank=rank + 1 if s < p - 1 else None,
            groups=groups,
        )
        roles.append((d, role))
    return roles


def shard_roles(devices: list[DevicePlan]) -> list[ShardRole]:
    """Each device's :class:`ShardRole`, ranks numbered in ``devices``' order.

    Devices with the same ``shard_group`` form one sharding group (None: all one
    group); every group must hold the same fractions in the same order, whose sum is 1.
    """
    for d in devices:
        if d.shard is None:
            raise WorkerError(f"plan: device {d.id}: an fsdp plan gives every device a shard")
    keys = list(dict.fromkeys(d.shard_group for d in devices))
    groups = tuple(tuple(r for r, d in enumerate(devices) if d.shard_group == key) for key in keys)
    fractions = tuple(float(devices[r].shard or 0.0) for r in groups[0])
    if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise WorkerError(
            f"plan: the shards of group {keys[0]} sum to {sum(fractions):.6f}; they must sum to 1"
        )
    for key, members in zip(keys, groups, strict=True):
        mine = tuple(float(devices[r].shard or 0.0) for r in members)
        if len(mine) != len(fractions) or not all(
            math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
            for a, b in zip(mine, fractions, strict=True)
        ):
            raise WorkerError(
                f"plan: shard group {key} holds shards {list(mine)}, group {keys[0]} "
                f"{list(fractions)}; replicated groups must hold the same shards in one order"
            )
    return [
        ShardRole(group=g, index=members.index(r), groups=groups, fractions=fractions)
        for r in range(len(devices))
        for g, members in enumerate(groups)
        if r in members
    ]
