"""What a run tells its workers: one run spec, one rank spec per device, one builder.

Every strategy is described by the same two frozen records, which cross Ray as
they are: :class:`RunSpec` and :class:`RankSpec`; :func:`make_ranks` turns any
plan (``dp``, ``even``, ``proportional``, ``pp``, ``hybrid``) into rank specs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scheduler.models.presets import ModelPreset
from scheduler.planning.plan import DP_STRATEGIES, DevicePlan, Plan
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


def needs_pipeline(plan: Plan) -> bool:
    return plan.strategy not in DP_STRATEGIES or any(d.layers is not None for d in plan.devices)


def make_ranks(
    plan: Plan, *, preset: ModelPreset, pacing_of: PacingOf, cache_dir: Path
) -> list[RankSpec]:
    """The rank specs of ``plan``'s active devices (data-parallel or pipeline alike)."""
    if not plan.active:
        raise WorkerError("plan: no device has any samples")
    roles = _stage_roles(plan, preset) if needs_pipeline(plan) else [(d, None) for d in plan.active]
    loss_scaling = needs_loss_scaling(d.precision for d, _ in roles)
    pieces = None
    ranks = []
    for rank, (d, role) in enumerate(roles):
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
