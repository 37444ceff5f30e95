"""One run of a plan on warm workers: the step loop, written once for every strategy.

Data-parallel and pipeline ranks differ only in their :class:`~workers.runtime.spec.RankSpec`;
checkpoints, validation and in-place re-planning are written here once for all of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision
from workers.checkpoint import CheckpointInfo, CheckpointStore
from workers.cluster.actors import gather
from workers.cluster.pool import WorkerPool
from workers.errors import RecurringFailure, WorkerError
from workers.records import RankStep, StepMetrics, TrainResult
from workers.run.config import Checkpointing, RunConfig
from workers.run.faults import FaultInjector
from workers.run.hooks import RunHooks
from workers.run.replanning import Replanner
from workers.runtime.spec import RankSpec, RunSpec, reshare

SETUP_TIMEOUT_S = 180.0
"""Process-group formation and model build, generous for a loaded host."""
SHUTDOWN_TIMEOUT_S = 30.0

TakeBack = Callable[[int, Plan, float], ReplanDecision | None]
"""``(step, plan in force, restart_s)``, asked after a checkpoint written mid-run: a
decision to go on from it on another plan (devices that came back), or None."""


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


def whole_model_state(
    actors: Sequence[Any], ids: Sequence[str], ranks: Sequence[RankSpec]
) -> dict[str, Any]:
    """The model under whole-model names: rank 0's, or merged from the ranks that write a
    checkpoint (pipeline 0's stages, the first sharding group)."""
    holders = writer_ranks(ranks)
    if ranks[0].stage is None and ranks[0].shard is None:
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
    """Ranks that write a checkpoint part: rank 0, every stage of pipeline 0, or every
    rank of the first sharding group (a collective among them assembles the tensors)."""
    return [
        i
        for i, r in enumerate(ranks)
        if r.rank == 0
        or (r.stage is not None and r.rank < r.stage.num_stages)
        or (r.shard is not None and r.shard.group == 0)
    ]


def save_checkpoint(
    actors: Sequence[Any],
    ids: Sequence[str],
    *,
    store: CheckpointStore,
    ranks: Sequence[RankSpec],
    run_spec: RunSpec,
    plan: Plan,
    policy: Checkpointing,
    step: int,
) -> tuple[CheckpointInfo, tuple[int, ...]]:
    """Every writing rank writes its part in parallel; then the manifest makes it count.

    Returns the checkpoint and the steps of those kept after pruning.
    """
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
    return info, store.prune(policy.keep_last)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSetup:
    """What every run of one job shares: the workers, what is trained, the settings and
    hooks, the job's checkpoint store, and its fault injector and re-planner."""

    pool: WorkerPool
    run_spec: RunSpec
    config: RunConfig
    hooks: RunHooks
    store: CheckpointStore | None
    """The job's checkpoints (None without checkpointing)."""
    faults: FaultInjector | None
    replanner: Replanner | None


class Run:
    """One run of a job's steps on one plan: owns the actors, the plan and ranks in force,
    the steps done, when it last checkpointed and what a restart would cost, and the plan
    a re-plan through a checkpoint hands to the job (:attr:`next_plan`).

    It takes warm actors from the pool, hands rank 0's address and port to every rank and
    joins them into the run's process group, restores ``restore`` if given, drives the
    steps in lockstep (``should_stop`` between steps), optionally reads the final state
    back, and has every rank leave the group. A data-parallel re-plan applies in place
    (:func:`workers.runtime.spec.reshare`); any other ends the run with a checkpoint. A run
    that fails gives its actors back to the pool, which keeps those that leave cleanly and
    replaces the dead and the stuck (:meth:`WorkerPool.salvage`), and raises
    :class:`~workers.errors.WorkerError` naming the device.
    """

    def __init__(
        self,
        setup: RunSetup,
        *,
        plan: Plan,
        ranks: Sequence[RankSpec],
        first_step: int,
        num_steps: int,
        restore: CheckpointInfo | None,
        on_step: Callable[[StepMetrics], None],
        take_back: TakeBack | None,
    ) -> None:
        self.setup = setup
        self.plan = plan
        self.ranks = list(ranks)
        self.ids = [r.device_id for r in ranks]
        self.first_step = first_step
        self.num_steps = num_steps
        self.restore = restore
        self.on_step = on_step
        """The job's record of each step (it reports to the hooks)."""
        self.take_back = take_back
        self.timeout_s = step_timeout_s(plan)
        self.actors: list[Any] = []
        self.history: list[StepMetrics] = []
        self.saved_steps: set[int] = set()
        self.last_save_at = time.monotonic()
        self.setup_s = 0.0
        self.checkpoint_s = 0.0
        self.next_plan: Plan | None = None
        """A re-plan that needs a restart ended the run: go on with it from the checkpoint
        written at the last step."""

    @property
    def restart_cost_s(self) -> float:
        """Seconds a restart through a checkpoint costs: forming the run and writing one."""
        if self.setup.config.checkpointing is None:
            return math.inf
        return self.setup_s + self.checkpoint_s

    def train(self) -> TrainResult:
        """Run the steps; the result of this run's steps alone."""
        begin = time.monotonic()
        pool = self.setup.pool
        self.actors = pool.acquire(self.ids)
        try:
            self._start()
            self.setup_s = time.monotonic() - begin
            stopped = self._steps()
            state = self._finish()
        except BaseException:
            pool.salvage(self.ids)
            raise
        return TrainResult.of(self.history, stopped=stopped, state=state)

    def _start(self) -> None:
        if self.setup.faults is not None:
            self.setup.faults.start_run()
        form_group(self.actors, self.ids, self.setup.run_spec, self.ranks)
        if self.restore is not None:
            info = self.restore
            gather(
                [a.load_checkpoint.remote(info.uri, info.manifest) for a in self.actors],
                self.ids,
                timeout_s=SETUP_TIMEOUT_S,
                what=f"restore of step {info.step}",
            )

    def _steps(self) -> bool:
        """Steps in lockstep until the last, a stop or a restart; True when stopped."""
        for step in range(self.first_step, self.first_step + self.num_steps):
            if self.next_plan is not None:
                return False
            if self.setup.hooks.should_stop():
                return True
            if self.setup.faults is not None:
                self.setup.faults.before_step(step, self.actors, self.ids)
            self._after_step(self._step(step))
        return False

    def _step(self, step: int) -> StepMetrics:
        begin = time.perf_counter()
        out: list[RankStep] = gather(
            [a.step.remote(step) for a in self.actors],
            self.ids,
            timeout_s=self.timeout_s,
            what=f"step {step}",
        )
        step_s = time.perf_counter() - begin
        loss = out[0].loss
        if not math.isfinite(loss):
            raise RecurringFailure(f"{self.ids[0]}: loss became {loss} at step {step} (diverged)")
        return StepMetrics(
            step=step,
            loss=loss,
            step_s=step_s,
            samples_per_s=self.plan.global_batch / step_s,
            devices=tuple(o.device for o in out),
            val_loss=self._validate(step),
        )

    def _validate(self, step: int) -> float | None:
        """The validation loss after ``step`` when it is due, else None."""
        validation = self.setup.config.validation
        last_step = self.first_step + self.num_steps - 1
        if validation is None or not validation.due(step, last_step):
            return None
        val_loss: float = gather(
            [a.evaluate.remote(validation.batches) for a in self.actors],
            self.ids,
            timeout_s=self.timeout_s,
            what=f"validation after step {step}",
        )[0]
        if not math.isfinite(val_loss):
            raise RecurringFailure(
                f"{self.ids[0]}: validation loss became {val_loss} at step {step} (diverged)"
            )
        return val_loss

    def _after_step(self, metrics: StepMetrics) -> None:
        self.history.append(metrics)
        self.on_step(metrics)
        checkpointing = self.setup.config.checkpointing
        if checkpointing is not None and checkpointing.due(
            metrics.step, time.monotonic() - self.last_save_at
        ):
            self._checkpoint(metrics.step)
            if self.take_back is not None:
                decision = self.take_back(metrics.step, self.plan, self.restart_cost_s)
                if decision is not None and decision.switch:
                    self._switch(decision)
                    return
        if self.setup.replanner is not None:
            self._follow_speed(metrics)

    def _checkpoint(self, step: int) -> None:
        checkpointing, store = self.setup.config.checkpointing, self.setup.store
        assert checkpointing is not None and store is not None
        begin = time.monotonic()
        info, kept_steps = save_checkpoint(
            self.actors,
            self.ids,
            store=store,
            ranks=self.ranks,
            run_spec=self.setup.run_spec,
            plan=self.plan,
            policy=checkpointing,
            step=step,
        )
        self.saved_steps.add(step)
        self.last_save_at = time.monotonic()
        self.checkpoint_s = self.last_save_at - begin
        self.setup.hooks.on_checkpoint(info, kept_steps)

    def _follow_speed(self, metrics: StepMetrics) -> None:
        assert self.setup.replanner is not None
        decision = self.setup.replanner.observe(
            metrics, self.plan, switch_cost_s=self.restart_cost_s
        )
        if decision is not None and decision.switch:
            self._switch(decision)

    def _switch(self, decision: ReplanDecision) -> None:
        """Apply a re-plan between two steps when it can; else end the run to restart on it."""
        self.setup.hooks.on_replan(decision)
        if not decision.in_place:
            self.next_plan = decision.new_plan
            return
        new_ranks = reshare(self.ranks, decision.new_plan)
        gather(
            [a.reshard.remote(r) for a, r in zip(self.actors, new_ranks, strict=True)],
            self.ids,
            timeout_s=SETUP_TIMEOUT_S,
            what="re-plan",
        )
        self.plan, self.ranks = decision.new_plan, new_ranks

    def _finish(self) -> dict[str, Any] | None:
        """Checkpoint where the run ended, read the state back when asked, leave the group."""
        last = self.history[-1].step if self.history else None
        checkpointing = self.setup.config.checkpointing
        if checkpointing is not None and last is not None and last not in self.saved_steps:
            self._checkpoint(last)  # at the end, or where a stop ended the run
        state = None
        if self.setup.config.keep_state and last is not None:
            state = whole_model_state(self.actors, self.ids, self.ranks)
            state["step"] = last
        try:
            gather(
                [a.leave.remote() for a in self.actors],
                self.ids,
                timeout_s=SHUTDOWN_TIMEOUT_S,
                what="leave",
            )
        except WorkerError:  # the results stand; the actors that cannot leave are replaced
            self.setup.pool.salvage(self.ids)
        return state
