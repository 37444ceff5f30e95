"""The driver's side of every run: the one loop, for every strategy.

:func:`run` takes warm actors from a :class:`~workers.cluster.pool.WorkerPool`, hands
rank 0's address and port to every rank and joins them into the run's
process group, restores a state if given, drives the steps in lockstep
(``should_stop`` between steps, each step to ``on_step``), optionally reads
the final state back, and has every rank leave the group. A run that fails
gives its actors back to the pool, which keeps those that leave the run
cleanly and replaces the dead and the stuck (:meth:`WorkerPool.salvage`), and
raises :class:`~workers.errors.WorkerError` naming the device. Data-parallel
and pipeline ranks differ only in their :class:`~workers.runtime.spec.RankSpec`;
checkpoints, recovery and re-planning are written here once for all of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision
from workers.checkpoint import CheckpointInfo, CheckpointStore
from workers.cluster.actors import gather
from workers.cluster.pool import WorkerPool
from workers.errors import WorkerError
from workers.records import RankStep, StepMetrics, TrainResult, median_devices, val_losses
from workers.run.faults import FaultInjector
from workers.run.replanning import Replanner
from workers.runtime.spec import RankSpec, RunSpec, reshare


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpointing:
    """When and where a run writes checkpoints (:mod:`workers.checkpoint`)."""

    root: str
    """The job's storage location: a directory or an fsspec URI every node can reach."""
    every_steps: int | None = 50
    """Write after every this many steps (None: not by steps)."""
    every_s: float | None = None
    """Write when this many seconds passed since the last one (None: not by time)."""
    keep_last: int = 2
    manifest: dict[str, Any] = field(default_factory=dict)
    """What the caller adds to every manifest (the job spec, ...)."""

    def due(self, step: int, since_s: float) -> bool:
        by_steps = self.every_steps is not None and (step + 1) % self.every_steps == 0
        by_time = self.every_s is not None and since_s >= self.every_s
        return by_steps or by_time


@dataclass(frozen=True, kw_only=True, slots=True)
class Validation:
    """When a run evaluates the model on the held-out split, and on how much of it.

    Evaluation runs after a step's update, forward only, on ``batches ×
    global_batch`` validation samples spread evenly over the split and the
    same at every evaluation (:mod:`workers.data.dataset`); every rank computes its
    plan's share and the loss sums are SUM-reduced, so the figure is the same
    whatever the plan. Its time is not part of the step's.
    """

    every_steps: int
    """Evaluate after every this many steps, and after the job's last step."""
    batches: int = 1
    """Validation samples, in global batches."""

    def __post_init__(self) -> None:
        if self.every_steps < 1:
            raise WorkerError(f"val_every: must be >= 1, got {self.every_steps}")
        if self.batches < 1:
            raise WorkerError(f"val_batches: must be >= 1, got {self.batches}")

    def due(self, step: int, last_step: int) -> bool:
        return (step + 1) % self.every_steps == 0 or step == last_step


MIN_AUTO_VAL_STEPS = 20
"""Jobs shorter than this are not evaluated unless asked (smoke tests, benchmarks)."""


def default_validation(
    steps: int, *, every: int | None = None, batches: int = 1
) -> Validation | None:
    """The validation a job of ``steps`` steps gets: ``every`` steps when given (0: none);
    by default ten evaluations, a tenth of the job apart, the last after the final step,
    for jobs of at least 20 steps, and none for shorter ones.

    >>> default_validation(200).every_steps, default_validation(5), default_validation(5, every=1)
    (20, None, Validation(every_steps=1, batches=1))
    """
    if every is None:
        every = -(-steps // 10) if steps >= MIN_AUTO_VAL_STEPS else 0
    return Validation(every_steps=every, batches=batches) if every > 0 else None


SETUP_TIMEOUT_S = 180.0
"""Process-group formation and model build, generous for a loaded host."""
SHUTDOWN_TIMEOUT_S = 30.0


def step_timeout_s(plan: Plan) -> float:
    """Generous bound on one step: a slow step is fine, a hung one is an error."""
    return max(60.0, 20.0 * plan.predicted_step_s)


def form_group(
    actors: Sequence[Any], ids: Sequence[str], run: RunSpec, ranks: Sequence[RankSpec]
) -> None:
    """Hand rank 0's address and port to every rank and join the run.

    When every worker is still in the group of exactly these devices in this
    rank order (the previous run was on the same devices), they keep it.
    """
    key = tuple(ids)
    groups = gather(
        [a.group.remote() for a in actors], ids, timeout_s=SETUP_TIMEOUT_S, what="group"
    )
    reuse = all(g == key for g in groups)
    addr, port = gather(
        [actors[0].rendezvous.remote()], ids[:1], timeout_s=SETUP_TIMEOUT_S, what="rendezvous"
    )[0]
    gather(
        [a.join.remote(run, r, addr, port, key, reuse) for a, r in zip(actors, ranks, strict=True)],
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
    before_step: Callable[[int], None] | None = None,
    validation: Validation | None = None,
) -> tuple[list[StepMetrics], bool]:
    """Run steps ``start_step …`` in lockstep; returns the history and whether it was stopped.

    With ``validation``, the steps it makes due carry their validation loss.
    """
    history: list[StepMetrics] = []
    timeout = step_timeout_s(plan)
    last_step = start_step + steps - 1
    for step in range(start_step, start_step + steps):
        if should_stop is not None and should_stop():
            return history, True
        if before_step is not None:
            before_step(step)
        begin = time.perf_counter()
        out: list[RankStep] = gather(
            [a.step.remote(step) for a in actors], ids, timeout_s=timeout, what=f"step {step}"
        )
        step_s = time.perf_counter() - begin
        loss = out[0].loss
        if not math.isfinite(loss):
            raise WorkerError(f"{ids[0]}: loss became {loss} at step {step} (diverged)")
        val_loss = None
        if validation is not None and validation.due(step, last_step):
            val_loss = gather(
                [a.evaluate.remote(validation.batches) for a in actors],
                ids,
                timeout_s=timeout,
                what=f"validation after step {step}",
            )[0]
            if not math.isfinite(val_loss):
                raise WorkerError(
                    f"{ids[0]}: validation loss became {val_loss} at step {step} (diverged)"
                )
        metrics = StepMetrics(
            step=step,
            loss=loss,
            step_s=step_s,
            samples_per_s=plan.global_batch / step_s,
            devices=tuple(o.device for o in out),
            val_loss=val_loss,
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


def writer_ranks(ranks: Sequence[RankSpec]) -> list[int]:
    """Ranks that write a checkpoint part: rank 0, or every stage of pipeline 0."""
    return [
        i
        for i, r in enumerate(ranks)
        if r.rank == 0 or (r.stage is not None and r.rank < r.stage.num_stages)
    ]


def save_checkpoint(
    actors: Sequence[Any],
    ids: Sequence[str],
    *,
    ranks: Sequence[RankSpec],
    run_spec: RunSpec,
    plan: Plan,
    policy: Checkpointing,
    step: int,
) -> CheckpointInfo:
    """Every writing rank writes its part in parallel; then the manifest makes it count."""
    store = CheckpointStore(policy.root)
    writers = writer_ranks(ranks)
    parts = [f"part-{i:04d}.safetensors" for i in writers]
    out = gather(
        [
            actors[i].save_checkpoint.remote(store.step_uri(step), part)
            for i, part in zip(writers, parts, strict=True)
        ],
        [ids[i] for i in writers],
        timeout_s=SETUP_TIMEOUT_S,
        what=f"checkpoint of step {step}",
    )
    info = store.commit(
        step,
        {part: names for part, (names, _) in zip(parts, out, strict=True)},
        {
            "optimizer_steps": out[0][1],
            "model": asdict(run_spec.preset),
            "seed": run_spec.seed,
            "global_batch": run_spec.global_batch,
            "plan": plan.to_dict(),
            **policy.manifest,
        },
    )
    store.prune(policy.keep_last)
    return info


def run(
    pool: WorkerPool,
    *,
    run_spec: RunSpec,
    ranks: Sequence[RankSpec],
    plan: Plan,
    steps: int,
    start_step: int = 0,
    restore: CheckpointInfo | None = None,
    checkpointing: Checkpointing | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    keep_state: bool = False,
    faults: FaultInjector | None = None,
    replanner: Replanner | None = None,
    on_replan: Callable[[ReplanDecision], None] | None = None,
    at_checkpoint: Callable[[int, Plan, float], ReplanDecision | None] | None = None,
    validation: Validation | None = None,
) -> TrainResult:
    """Train ``steps`` steps of ``plan`` from ``start_step`` on warm actors (module docstring).

    ``validation``: evaluate the held-out split when it says (:class:`Validation`).
    ``restore``: a checkpoint (of any plan) every rank loads its slice from first.
    ``checkpointing``: write checkpoints as it says, and after the last step or a stop.
    ``faults``: carry out a simulated cluster's fault schedule before each step.
    ``replanner``: follow speed changes; a data-parallel switch happens in place
    (:func:`workers.runtime.spec.reshare`), any other ends the run with a checkpoint
    and ``next_plan`` set. Every decision that switches goes to ``on_replan``.
    ``at_checkpoint(step, plan, restart_s)``: asked after each checkpoint written
    mid-run whether to go on from it on another plan (devices that came back).
    """
    ids = [r.device_id for r in ranks]
    begin = time.monotonic()
    actors = pool.acquire(ids)
    done = False
    saved: list[int] = []
    last_save = [time.monotonic()]
    cost_s = {"setup": 0.0, "checkpoint": 0.0}
    current = {"plan": plan, "ranks": list(ranks)}
    next_plan: list[Plan] = []

    def checkpoint(step: int) -> None:
        assert checkpointing is not None
        start = time.monotonic()
        info = save_checkpoint(
            actors,
            ids,
            ranks=current["ranks"],
            run_spec=run_spec,
            plan=current["plan"],
            policy=checkpointing,
            step=step,
        )
        saved.append(step)
        last_save[0] = time.monotonic()
        cost_s["checkpoint"] = last_save[0] - start
        if on_checkpoint is not None:
            on_checkpoint(info)

    def after_step(metrics: StepMetrics) -> None:
        if on_step is not None:
            on_step(metrics)
        if checkpointing is not None and checkpointing.due(
            metrics.step, time.monotonic() - last_save[0]
        ):
            checkpoint(metrics.step)
            if at_checkpoint is not None and not next_plan:
                decision = at_checkpoint(metrics.step, current["plan"], restart_cost_s())
                if decision is not None and decision.switch:
                    if on_replan is not None:
                        on_replan(decision)
                    next_plan.append(decision.new_plan)
                    return
        if replanner is not None:
            follow_speed(metrics)

    def restart_cost_s() -> float:
        return cost_s["setup"] + cost_s["checkpoint"] if checkpointing else math.inf

    def follow_speed(metrics: StepMetrics) -> None:
        assert replanner is not None
        decision = replanner.observe(metrics, current["plan"], switch_cost_s=restart_cost_s())
        if decision is None or not decision.switch:
            return
        if on_replan is not None:
            on_replan(decision)
        if decision.in_place:
            new_ranks = reshare(current["ranks"], decision.new_plan)
            gather(
                [a.reshard.remote(r) for a, r in zip(actors, new_ranks, strict=True)],
                ids,
                timeout_s=SETUP_TIMEOUT_S,
                what="re-plan",
            )
            current["plan"], current["ranks"] = decision.new_plan, new_ranks
        else:
            next_plan.append(decision.new_plan)

    def stop_now() -> bool:
        return bool(next_plan) or (should_stop is not None and should_stop())

    try:
        if faults is not None:
            faults.start_run()
        form_group(actors, ids, run_spec, ranks)
        if restore is not None:
            gather(
                [a.load_checkpoint.remote(restore.uri, restore.manifest) for a in actors],
                ids,
                timeout_s=SETUP_TIMEOUT_S,
                what=f"restore of step {restore.step}",
            )
        cost_s["setup"] = time.monotonic() - begin
        history, stopped = run_steps(
            actors,
            ids,
            plan=plan,
            steps=steps,
            start_step=start_step,
            on_step=after_step,
            should_stop=stop_now,
            before_step=(lambda step: faults.before_step(step, actors, ids)) if faults else None,
            validation=validation,
        )
        stopped = stopped and not next_plan
        if checkpointing is not None and history and history[-1].step not in saved:
            checkpoint(history[-1].step)  # at the end, or where a stop ended the run
        state = None
        if keep_state and history:
            state = whole_model_state(actors, ids, ranks)
            state["step"] = history[-1].step
        try:
            gather(
                [a.leave.remote() for a in actors], ids, timeout_s=SHUTDOWN_TIMEOUT_S, what="leave"
            )
        except WorkerError:  # the results stand; the actors that cannot leave are replaced
            pool.salvage(ids)
        done = True
    finally:
        if not done:
            pool.salvage(ids)
    return TrainResult(
        steps_done=len(history),
        losses=[m.loss for m in history],
        val_losses=val_losses(history),
        step_times_s=[m.step_s for m in history],
        devices=median_devices(history),
        stopped=stopped,
        state=state,
        next_plan=next_plan[0] if next_plan else None,
    )
