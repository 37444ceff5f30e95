"""A job's life in the driver: its runs, one after another, until every step is done.

DESIGN.md, "A job's life": a failed device does not end the job, a device that came
back is taken back at a checkpoint, and a re-plan that moves model states goes
through a checkpoint; the data order is a function of seed and step, so the job
trains exactly as an uninterrupted one would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision, ReplanSettings
from workers.checkpoint import CheckpointInfo, CheckpointStore
from workers.cluster.pool import WorkerPool
from workers.errors import WorkerError
from workers.records import Recovery, StepMetrics, TrainResult
from workers.run.config import RunConfig
from workers.run.driver import Run, RunSetup
from workers.run.failures import FailureAction, FailurePolicy
from workers.run.faults import FaultInjector
from workers.run.hooks import RunHooks
from workers.run.pace import PaceWatch
from workers.run.replanning import Replanner
from workers.runtime.spec import RankSpec, RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingRecovery:
    """A recovery waiting for its first step: its record, but for the time it took."""

    noticed_at: float
    """``time.monotonic()`` when the failure was noticed."""
    recovery: Recovery
    """With ``recover_s`` still 0."""

    def done(self) -> Recovery:
        return replace(self.recovery, recover_s=time.monotonic() - self.noticed_at)


class Job:
    """Steps ``0 … steps-1`` of one job (from after ``restore`` when given), across as many
    :class:`~workers.run.driver.Run` as it takes. Owns the record of every step, the plan
    in force, the failure budget, the devices left out as lost and the recovery waiting
    for its first step.

    When a device's worker dies, its Ray node is lost or a collective times out, the job
    gives the run's workers back to the pool, asks ``replan(lost)`` for a plan of the same
    global batch on the devices still usable (a crashed process on a live device gets a
    new worker; a lost device is left out), restores the last checkpoint into it and goes
    on from the step after it. Steps run again replace their earlier records
    (``on_step`` sees them twice); each recovery is reported once its first step is done.
    What to do about a failure is :class:`~workers.run.failures.FailurePolicy`'s call.

    A device left out as lost that comes back (its Ray node is alive again, or a simulated
    device is restored) is taken back at the next checkpoint when the predicted gain over
    the remaining steps pays for the restart (a ``replan`` decision, as for speed changes).
    """

    def __init__(
        self,
        pool: WorkerPool,
        *,
        run_spec: RunSpec,
        plan: Plan,
        steps: int,
        ranks_of: Callable[[Plan], Sequence[RankSpec]],
        replan: Callable[[set[str]], Plan],
        config: RunConfig,
        hooks: RunHooks,
        restore: CheckpointInfo | None,
    ) -> None:
        checkpointing = config.checkpointing
        self.setup = RunSetup(
            pool=pool,
            run_spec=run_spec,
            config=config,
            hooks=hooks,
            store=CheckpointStore(checkpointing.root) if checkpointing is not None else None,
            faults=FaultInjector(config.faults, pool) if config.faults else None,
            replanner=Replanner(config.live) if config.live is not None else None,
        )
        self.plan = plan
        self.steps = steps
        self.ranks_of = ranks_of
        self.replan = replan
        """Plans the same global batch without the given lost devices (raises when none is left)."""
        self.restore = restore
        self.initial = restore
        """Where the job started: a recovery before its first checkpoint restarts from here."""
        self.by_step: dict[int, StepMetrics] = {}
        self.last_step = -1
        """The last step done by the current run."""
        self.left_out: set[str] = set()
        """Devices lost during this job, until they come back."""
        self.pending: PendingRecovery | None = None
        self.failures = FailurePolicy(
            max_failures=config.max_failures, durable=checkpointing is not None
        )
        self.min_gain = ReplanSettings().min_relative_gain
        self.pace = PaceWatch()
        """Whether the simulated devices keep their GPUs' pace (said once per job)."""

    def train(self) -> TrainResult:
        """Run until every step is done or a stop; the result over every step."""
        try:
            while True:
                run = self._next_run()
                try:
                    result = run.train()
                except WorkerError as exc:
                    self._recover(exc)
                    continue
                if run.next_plan is None or self.setup.store is None:
                    return self._result(result)
                self.plan = run.next_plan  # a re-plan through the checkpoint just written
                self.restore = self.setup.store.latest()
        finally:
            if self.setup.faults is not None:
                self.setup.faults.finish()

    def _next_run(self) -> Run:
        start = self.restore.step + 1 if self.restore is not None else 0
        self.last_step = start - 1
        return Run(
            self.setup,
            plan=self.plan,
            ranks=self.ranks_of(self.plan),
            first_step=start,
            num_steps=max(0, self.steps - start),
            restore=self.restore,
            on_step=self._seen,
            take_back=self._take_back if self.left_out else None,
        )

    def _seen(self, metrics: StepMetrics) -> None:
        self.by_step[metrics.step] = metrics
        self.last_step = metrics.step
        self.setup.hooks.on_step(metrics)
        notice = self.pace.observe(metrics)
        if notice is not None:
            self.setup.hooks.on_host_bound(notice)
        if self.pending is not None:
            recovery, self.pending = self.pending.done(), None
            self.setup.hooks.on_recovery(recovery)

    def _recover(self, error: WorkerError) -> None:
        """Re-plan around a failed run and restore the last checkpoint, or raise."""
        noticed, noticed_s = time.monotonic(), time.time()
        failed_step = self.last_step + 1
        decision = self.failures.decide(error, step=failed_step)
        if decision.action is FailureAction.RAISE:
            raise error
        if decision.action is FailureAction.GIVE_UP:
            raise WorkerError(decision.reason) from error
        lost = self.setup.pool.lost(probe=True) & {d.id for d in self.plan.devices}
        self.left_out.update(lost)
        new_plan = self.replan(self.left_out)
        assert self.setup.store is not None  # a durable job: FailurePolicy retries no other
        self.restore = self.setup.store.latest() or self.initial
        self.pending = PendingRecovery(
            noticed_at=noticed,
            recovery=Recovery(
                time_s=noticed_s,
                error=str(error),
                failed_step=failed_step,
                resumed_step=self.restore.step + 1 if self.restore is not None else 0,
                lost=tuple(sorted(lost)),
                old_plan=self.plan.to_dict(),
                new_plan=new_plan.to_dict(),
                recover_s=0.0,
            ),
        )
        self.plan = new_plan

    def _take_back(self, step: int, current: Plan, restart_s: float) -> ReplanDecision | None:
        """At a checkpoint: go on with the devices that came back, when it pays."""
        back = self.left_out - self.setup.pool.lost()
        if not back:
            return None
        new_plan = self.replan(self.left_out - back)
        steps_left = max(0, self.steps - step - 1)
        gain_s = current.predicted_step_s - new_plan.predicted_step_s
        switch = (
            gain_s > self.min_gain * current.predicted_step_s and gain_s * steps_left > restart_s
        )
        self.left_out.difference_update(back)  # asked once: a later recovery may still use them
        if not switch:  # too close to the end: the plan in force stays, and its record
            self.replan(self.left_out | back)
            return None
        return ReplanDecision(
            step=step,
            switch=True,
            in_place=False,
            reason=f"{', '.join(sorted(back))} came back: re-planned on "
            f"{len(new_plan.active)} devices, predicted step "
            f"{current.predicted_step_s:.3f} s -> {new_plan.predicted_step_s:.3f} s",
            changes=(),
            lost=(),
            old_plan=current,
            new_plan=new_plan,
            old_step_s=current.predicted_step_s,
            new_step_s=new_plan.predicted_step_s,
            steps_left=steps_left,
            switch_cost_s=restart_s,
        )

    def _result(self, last_run: TrainResult) -> TrainResult:
        """Over every step, one record each; device medians over the final plan's steps."""
        history = [self.by_step[s] for s in sorted(self.by_step)]
        final_ids = [d.id for d in history[-1].devices] if history else []
        final_plan_steps = [m for m in history if [d.id for d in m.devices] == final_ids]
        return TrainResult.of(
            history, stopped=last_run.stopped, state=last_run.state, medians_over=final_plan_steps
        )
