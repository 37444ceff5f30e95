"""Pipeline plans as ranks: stage order, the pieces each stage holds, who syncs what.

Pure helpers of the pipeline engine (:mod:`workers.runtime.pipeline_engine`) and the
rank builder (:mod:`workers.runtime.spec`). Ranks are the plan's active devices
ordered by pipeline, then stage. Every piece of the model (token embedding,
position embedding, each block, the final norm) is SUM-all-reduced among the
ranks that hold it: :func:`sync_groups` computes those groups from the plan,
the same on every rank.
"""

from __future__ import annotations

from scheduler.models.presets import ModelPreset
from scheduler.planning.plan import DevicePlan, Plan
from workers.errors import WorkerError
from workers.models.families import stage_pieces

SyncGroup = tuple[tuple[int, ...], tuple[str, ...]]
"""Ranks holding the same pieces, and those pieces' names."""


def ordered_stages(plan: Plan) -> list[DevicePlan]:
    """Active devices by pipeline then stage: their ranks. Checks the pipelines are whole."""
    active = [d for d in plan.active if d.layers is not None]
    if len(active) != len(plan.active):
        missing = next(d.id for d in plan.active if d.layers is None)
        raise WorkerError(f"plan: device {missing} of a {plan.strategy} plan has no layers")
    active.sort(key=lambda d: (d.pipeline or 0, d.stage or 0))
    pipelines: dict[int, list[DevicePlan]] = {}
    for d in active:
        pipelines.setdefault(d.pipeline or 0, []).append(d)
    for index, stages in pipelines.items():
        if [d.stage for d in stages] != list(range(len(stages))):
            raise WorkerError(
                f"plan: pipeline {index} has stages {[d.stage for d in stages]}; "
                "expected 0..p-1, one device each"
            )
        for a, b in zip(stages, stages[1:], strict=False):
            assert a.layers is not None and b.layers is not None
            if a.layers[1] != b.layers[0]:
                raise WorkerError(
                    f"plan: {a.id} ends at block {a.layers[1]} but the next stage "
                    f"{b.id} starts at {b.layers[0]}"
                )
            if (a.samples, a.offset, a.accum_steps) != (b.samples, b.offset, b.accum_steps):
                raise WorkerError(
                    f"plan: {a.id} and {b.id} of pipeline {index} disagree on "
                    "samples, offset or micro-batches"
                )
    return active


def sync_groups(stages: list[DevicePlan], preset: ModelPreset) -> list[SyncGroup]:
    """One all-reduce per distinct set of holders of some pieces (module docstring).

    The pieces a stage holds are its family's (:func:`workers.models.families.stage_pieces`).
    """
    last_stage: dict[int, int] = {}
    for d in stages:
        last_stage[d.pipeline or 0] = max(last_stage.get(d.pipeline or 0, 0), d.stage or 0)
    holders: dict[str, list[int]] = {}
    for rank, d in enumerate(stages):
        assert d.layers is not None
        pieces = stage_pieces(
            preset,
            layers=d.layers,
            is_first=d.stage == 0,
            is_last=d.stage == last_stage[d.pipeline or 0],
        )
        for piece in dict.fromkeys(pieces):
            holders.setdefault(piece, []).append(rank)
    groups: dict[tuple[int, ...], list[str]] = {}
    for piece, ranks in holders.items():
        if len(ranks) > 1:
            groups.setdefault(tuple(sorted(ranks)), []).append(piece)
    return [(ranks, tuple(pieces)) for ranks, pieces in sorted(groups.items())]
