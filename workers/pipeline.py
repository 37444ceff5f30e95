"""The pipeline runtime (``pp`` and ``hybrid`` plans): the driver and its pure helpers.

Ranks are the plan's active devices ordered by pipeline, then stage; each gets
a :class:`workers.stage_worker.PipelineWorker` actor that runs its stage under
1F1B and exchanges activations and gradients point-to-point with its
neighbours. Every piece of the model (token embedding, position embedding,
each block, the final norm) is SUM-all-reduced among the ranks that hold it:
:func:`sync_groups` computes those groups from the plan, the same on every
rank. Simulated stages are paced by the host time of their pieces
(:mod:`workers.layer_profile`), scaled like every simulated device.
:func:`train_pipeline` is what ``workers.session.train`` calls for pp/hybrid
plans and returns the same :class:`~workers.records.TrainResult` as the
data-parallel runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

from scheduler.cluster import Cluster
from scheduler.models import ModelPreset
from scheduler.plan import DevicePlan, Plan
from workers.actors import actor_options, gather, kill_all
from workers.calibration import default_cache_dir
from workers.devices import Pacing
from workers.driver import SETUP_TIMEOUT_S, form_group, run_steps, shut_down, train_result
from workers.errors import WorkerError
from workers.layer_profile import host_layers, stage_host
from workers.records import OptimizerConfig, StepMetrics, TrainResult
from workers.runtime import DTYPES
from workers.stage_worker import PipelineWorker, StageSpec, SyncGroup

DEFAULT_OPTIMIZER = OptimizerConfig()


# --- pure helpers: ranks, pieces, groups -----------------------------------


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


def pieces_of(d: DevicePlan, *, is_first: bool, is_last: bool) -> list[str]:
    """Names of the model pieces a stage holds.

    >>> pieces_of(DevicePlan(id="a/0", samples=1, micro_batch=1, accum_steps=1, busy_s=0,
    ...                      peak_bytes=0, layers=(0, 2)), is_first=True, is_last=False)
    ['wte', 'wpe', 'block0', 'block1']
    """
    assert d.layers is not None
    out = ["wte", "wpe"] if is_first else []
    out += [f"block{i}" for i in range(*d.layers)]
    if is_last:
        out += ["ln_f"] if is_first else ["wte", "ln_f"]
    return out


def sync_groups(stages: list[DevicePlan]) -> list[SyncGroup]:
    """One all-reduce per distinct set of holders of some pieces (module docstring)."""
    last_stage: dict[int, int] = {}
    for d in stages:
        last_stage[d.pipeline or 0] = max(last_stage.get(d.pipeline or 0, 0), d.stage or 0)
    holders: dict[str, list[int]] = {}
    for rank, d in enumerate(stages):
        pieces = pieces_of(d, is_first=d.stage == 0, is_last=d.stage == last_stage[d.pipeline or 0])
        for piece in dict.fromkeys(pieces):
            holders.setdefault(piece, []).append(rank)
    groups: dict[tuple[int, ...], list[str]] = {}
    for piece, ranks in holders.items():
        if len(ranks) > 1:
            groups.setdefault(tuple(sorted(ranks)), []).append(piece)
    return [(ranks, tuple(pieces)) for ranks, pieces in sorted(groups.items())]


# --- the driver ------------------------------------------------------------


def make_stage_specs(
    *,
    cluster: Cluster,
    preset: ModelPreset,
    plan: Plan,
    seed: int,
    dataset: Path | None,
    optimizer: OptimizerConfig,
    simulated: bool,
    pacing_of: Callable[[str], tuple[int, Pacing | None]],
    cache_dir: Path | None = None,
    dtype: str = "float32",
) -> list[StageSpec]:
    if dtype not in DTYPES:
        raise WorkerError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    stages = ordered_stages(plan)
    groups = tuple(sync_groups(stages))
    num_stages = {}
    for d in stages:
        num_stages[d.pipeline or 0] = max(num_stages.get(d.pipeline or 0, 0), (d.stage or 0) + 1)
    pieces = None
    specs = []
    for rank, d in enumerate(stages):
        assert d.layers is not None
        p, s = num_stages[d.pipeline or 0], d.stage or 0
        capacity, pacing = pacing_of(d.id)
        if pacing is not None:
            if pieces is None:
                pieces = host_layers(
                    preset, pacing.host, cache_dir=cache_dir or default_cache_dir()
                )
            host = stage_host(
                pieces, num_blocks=d.layers[1] - d.layers[0], embed=s == 0, head=s == p - 1
            )
            pacing = replace(pacing, host=host)
        specs.append(
            StageSpec(
                device_id=d.id,
                rank=rank,
                world_size=len(stages),
                preset=preset,
                seed=seed,
                global_batch=plan.global_batch,
                offset=d.offset,
                samples=d.samples,
                accum_steps=d.accum_steps,
                first=d.layers[0],
                last=d.layers[1],
                stage=s,
                num_stages=p,
                prev_rank=rank - 1 if s > 0 else None,
                next_rank=rank + 1 if s < p - 1 else None,
                groups=groups,
                optimizer=optimizer,
                dataset=dataset,
                simulated=simulated,
                capacity_bytes=capacity,
                pacing=pacing,
                dtype=dtype,
            )
        )
    return specs


def train_pipeline(
    *,
    cluster: Cluster,
    model: ModelPreset,
    plan: Plan,
    steps: int,
    seed: int,
    dataset: Path | None = None,
    optimizer: OptimizerConfig = DEFAULT_OPTIMIZER,
    simulated: bool = True,
    on_step: Callable[[StepMetrics], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    pacing_of: Callable[[str], tuple[int, Pacing | None]],
    cache_dir: Path | None = None,
    dtype: str = "float32",
    keep_state: bool = False,
) -> TrainResult:
    """Train a pp/hybrid plan (module docstring); the contract of ``session.train``.

    ``keep_state=True`` returns the whole model's parameters after the last
    step, gathered from the stages of pipeline 0 under their whole-model names
    (``{"step", "model", "optimizer": None}``: optimizer state stays per stage).
    """
    specs = make_stage_specs(
        cluster=cluster,
        preset=model,
        plan=plan,
        seed=seed,
        dataset=dataset,
        optimizer=optimizer,
        simulated=simulated,
        pacing_of=pacing_of,
        cache_dir=cache_dir,
        dtype=dtype,
    )
    if not specs:
        raise WorkerError("plan: no device has any samples")
    ids = [s.device_id for s in specs]
    remote_cls = ray.remote(PipelineWorker)
    actors: list[Any] = []
    state = None
    try:
        for spec in specs:
            options = actor_options(cluster.device(spec.device_id), simulated=simulated)
            actors.append(remote_cls.options(**options).remote(spec))
        form_group(actors, ids)
        history, stopped = run_steps(
            actors, ids, plan=plan, steps=steps, on_step=on_step, should_stop=should_stop
        )
        if keep_state and history:
            first_pipeline = [i for i, s in enumerate(specs) if specs[0].num_stages > s.rank]
            parts = gather(
                [actors[i].state_dict.remote() for i in first_pipeline],
                [ids[i] for i in first_pipeline],
                timeout_s=SETUP_TIMEOUT_S,
                what="state save",
            )
            merged: dict[str, Any] = {}
            for part in parts:
                merged.update(part)
            state = {"step": history[-1].step, "model": merged, "optimizer": None}
        shut_down(actors, ids)
    finally:
        kill_all(actors)
    return train_result(history, stopped=stopped, state=state)
