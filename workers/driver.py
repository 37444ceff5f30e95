"""The driver's side of every run: the one loop, for every strategy.

:func:`run` takes warm actors from a :class:`~workers.pool.WorkerPool`, hands
rank 0's address and port to every rank and joins them into the run's
process group, restores a state if given, drives the steps in lockstep
(``should_stop`` between steps, each step to ``on_step``), optionally reads
the final state back, and has every rank leave the group. A run that fails
gives its actors back to the pool to be replaced (a stuck collective cannot
be left cleanly) and raises :class:`~workers.errors.WorkerError` naming the
device. Data-parallel and pipeline ranks differ only in their
:class:`~workers.spec.RankSpec`; checkpoints, recovery and re-planning are
written here once for all of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.plan import Plan
from workers.actors import gather
from workers.errors import WorkerError
from workers.pool import WorkerPool
from workers.records import RankStep, StepMetrics, TrainResult, median_devices
from workers.spec import RankSpec, RunSpec

SETUP_TIMEOUT_S = 180.0
"""Process-group formation and model build, generous for a loaded host."""
SHUTDOWN_TIMEOUT_S = 30.0


def step_timeout_s(plan: Plan) -> float:
    """Generous bound on one step: a slow step is fine, a hung one is an error."""
    return max(60.0, 20.0 * plan.predicted_step_s)


def form_group(
    actors: Sequence[Any], ids: Sequence[str], run: RunSpec, ranks: Sequence[RankSpec]
) -> None:
    """Hand rank 0's address and port to every rank and join the run."""
    addr, port = gather(
        [actors[0].rendezvous.remote()], ids[:1], timeout_s=SETUP_TIMEOUT_S, what="rendezvous"
    )[0]
    gather(
        [a.join.remote(run, r, addr, port) for a, r in zip(actors, ranks, strict=True)],
        ids,
        timeout_s=SETUP_TIMEOUT_S,
        what="process-group setup",
    )


def run_steps(
    actors: Sequence[Any],
    ids: Sequence[str],
    *,
    plan: Plan,
    steps: int,
    start_step: int = 0,
    on_step: Callable[[StepMetrics], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[StepMetrics], bool]:
    """Run steps ``start_step …`` in lockstep; returns the history and whether it was stopped."""
    history: list[StepMetrics] = []
    timeout = step_timeout_s(plan)
    for step in range(start_step, start_step + steps):
        if should_stop is not None and should_stop():
            return history, True
        begin = time.perf_counter()
        out: list[RankStep] = gather(
            [a.step.remote(step) for a in actors], ids, timeout_s=timeout, what=f"step {step}"
        )
        step_s = time.perf_counter() - begin
        loss = out[0].loss
        if not math.isfinite(loss):
            raise WorkerError(f"{ids[0]}: loss became {loss} at step {step} (diverged)")
        metrics = StepMetrics(
            step=step,
            loss=loss,
            step_s=step_s,
            samples_per_s=plan.global_batch / step_s,
            devices=tuple(o.device for o in out),
        )
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
    return history, False


def whole_model_state(
    actors: Sequence[Any], ids: Sequence[str], ranks: Sequence[RankSpec]
) -> dict[str, Any]:
    """The model under whole-model names: rank 0's, or merged from pipeline 0's stages."""
    holders = [i for i, r in enumerate(ranks) if r.stage is None or r.rank < r.stage.num_stages]
    if ranks[0].stage is None:
        return gather(
            [actors[0].state_dict.remote()], ids[:1], timeout_s=SETUP_TIMEOUT_S, what="state save"
        )[0]
    parts = gather(
        [actors[i].model_state.remote() for i in holders],
        [ids[i] for i in holders],
        timeout_s=SETUP_TIMEOUT_S,
        what="state save",
    )
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return {"model": merged, "optimizer": None}


def run(
    pool: WorkerPool,
    *,
    run_spec: RunSpec,
    ranks: Sequence[RankSpec],
    plan: Plan,
    steps: int,
    start_step: int = 0,
    initial_state: dict[str, Any] | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    keep_state: bool = False,
) -> TrainResult:
    """Train ``steps`` steps of ``plan`` from ``start_step`` on warm actors (module docstring)."""
    ids = [r.device_id for r in ranks]
    actors = pool.acquire(ids)
    done = False
    try:
        form_group(actors, ids, run_spec, ranks)
        if initial_state is not None:
            gather(
                [a.load_state_dict.remote(initial_state) for a in actors],
                ids,
                timeout_s=SETUP_TIMEOUT_S,
                what="state restore",
            )
        history, stopped = run_steps(
            actors,
            ids,
            plan=plan,
            steps=steps,
            start_step=start_step,
            on_step=on_step,
            should_stop=should_stop,
        )
        state = None
        if keep_state and history:
            state = whole_model_state(actors, ids, ranks)
            state["step"] = history[-1].step
        try:
            gather(
                [a.leave.remote() for a in actors], ids, timeout_s=SHUTDOWN_TIMEOUT_S, what="leave"
            )
        except WorkerError:  # the results stand; the actors are replaced
            pool.discard(ids)
        done = True
    finally:
        if not done:
            pool.discard(ids)
    return TrainResult(
        steps_done=len(history),
        losses=[m.loss for m in history],
        step_times_s=[m.step_s for m in history],
        devices=median_devices(history),
        stopped=stopped,
        state=state,
    )
