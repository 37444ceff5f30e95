"""A job's life in the driver: train, checkpoint, and recover from lost devices.

DESIGN.md, "A job's life": :func:`train_job` runs the driver loop
(:func:`workers.run.driver.run`) with checkpoints, and when a device's worker
dies, its Ray node is lost or a collective times out, it does not end the
job: it gives the run's workers back to the pool, asks the caller for a new
plan of the same global batch on the devices still usable (a crashed
process on a live device gets a new worker; a lost device is left out),
restores the last checkpoint into the new plan and goes on from the step
after it. The data order is a function of seed and step, so the recovered
job trains exactly as an uninterrupted one; the steps after the checkpoint
are run again and their records replace the earlier ones (``on_step`` sees
them twice). Each recovery is reported as a :class:`Recovery`.

A device left out as lost that comes back (its Ray node is alive again, or
a simulated device is restored) is taken back at the job's next checkpoint:
the same global batch is planned on it and the rest and, when the predicted
gain over the remaining steps pays for the restart, the job goes on from that
checkpoint on the new plan (a ``replan`` decision, as for speed changes).

An error that would recur — out of memory from the plan, a diverged loss —
is not retried; nor is anything past ``max_failures`` recoveries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision, ReplanSettings
from workers.checkpoint import CheckpointInfo, CheckpointStore
from workers.cluster.pool import WorkerPool
from workers.errors import WorkerError
from workers.records import StepMetrics, TrainResult, median_devices, val_losses
from workers.run import driver
from workers.run.driver import Checkpointing, Validation
from workers.run.faults import FaultInjector
from workers.run.replanning import Replanner
from workers.runtime.spec import RankSpec, RunSpec

RECURRING = ("out of memory", "diverged", "checkpoint:", "dataset:", "plan:")
"""Messages of errors a retry would meet again."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """One recovery from a failure, as the job record and the dashboard show it."""

    time_s: float
    """When the failure was noticed (epoch seconds)."""
    error: str
    failed_step: int
    """The step that did not complete."""
    resumed_step: int
    """The first step run again (the one after the restored checkpoint)."""
    lost: tuple[str, ...]
    """Devices left out because they are gone."""
    old_plan: dict[str, Any]
    new_plan: dict[str, Any]
    recover_s: float
    """From noticing the failure to the end of the first step after it."""

    @property
    def steps_redone(self) -> int:
        return self.failed_step - self.resumed_step

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "error": self.error,
            "failed_step": self.failed_step,
            "resumed_step": self.resumed_step,
            "steps_redone": self.steps_redone,
            "lost": list(self.lost),
            "old_plan": self.old_plan,
            "new_plan": self.new_plan,
            "recover_s": self.recover_s,
        }


def is_recurring(error: WorkerError) -> bool:
    text = str(error)
    return any(marker in text for marker in RECURRING)


def train_job(
    pool: WorkerPool,
    *,
    run_spec: RunSpec,
    plan: Plan,
    steps: int,
    ranks_of: Callable[[Plan], Sequence[RankSpec]],
    replan: Callable[[set[str]], Plan],
    checkpointing: Checkpointing | None,
    max_failures: int = 3,
    restore: CheckpointInfo | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_checkpoint: Callable[[CheckpointInfo], None] | None = None,
    on_recovery: Callable[[Recovery], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    faults: FaultInjector | None = None,
    replanner: Replanner | None = None,
    on_replan: Callable[[ReplanDecision], None] | None = None,
    keep_state: bool = False,
    validation: Validation | None = None,
) -> TrainResult:
    """Train steps ``0 … steps-1`` (from after ``restore`` when given), surviving failures.

    ``ranks_of(plan)`` builds a plan's rank specs; ``replan(lost)`` plans the
    same global batch without the ``lost`` devices (it raises when nothing is
    left). Without ``checkpointing`` nothing is recovered and a re-plan happens only
    in place. ``faults`` and ``replanner`` go to every run (:func:`workers.run.driver.run`);
    a re-plan that needs a restart goes on from the checkpoint written where it
    was decided. Returns the result over every step, one record per step.
    """
    by_step: dict[int, StepMetrics] = {}
    last_step = -1  # the last step done by the current attempt
    failures: list[str] = []
    pending: dict[str, Any] | None = None  # a recovery waiting for its first step
    stopped = False
    initial = restore
    left_out: set[str] = set()  # devices lost during this job, until they come back
    min_gain = ReplanSettings().min_relative_gain

    def take_back(step: int, current: Plan, restart_s: float) -> ReplanDecision | None:
        """At a checkpoint: go on with the devices that came back, when it pays."""
        back = left_out - pool.lost()
        if not back:
            return None
        new_plan = replan(left_out - back)
        steps_left = max(0, steps - step - 1)
        gain_s = current.predicted_step_s - new_plan.predicted_step_s
        switch = gain_s > min_gain * current.predicted_step_s and gain_s * steps_left > restart_s
        left_out.difference_update(back)  # asked once: a later recovery may still use them
        if not switch:  # too close to the end: the plan in force stays, and its record
            replan(left_out | back)
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

    def seen(metrics: StepMetrics) -> None:
        nonlocal pending, last_step
        by_step[metrics.step] = metrics
        last_step = metrics.step
        if on_step is not None:
            on_step(metrics)
        if pending is not None:
            recovery = Recovery(recover_s=time.monotonic() - pending.pop("started"), **pending)
            pending = None
            if on_recovery is not None:
                on_recovery(recovery)

    while True:
        start = restore.step + 1 if restore is not None else 0
        last_step = start - 1
        try:
            result = driver.run(
                pool,
                run_spec=run_spec,
                ranks=ranks_of(plan),
                plan=plan,
                steps=max(0, steps - start),
                start_step=start,
                restore=restore,
                checkpointing=checkpointing,
                on_step=seen,
                on_checkpoint=on_checkpoint,
                should_stop=should_stop,
                faults=faults,
                replanner=replanner,
                on_replan=on_replan,
                at_checkpoint=take_back if left_out else None,
                keep_state=keep_state,
                validation=validation,
            )
            stopped = result.stopped
            if result.next_plan is None or checkpointing is None:
                break
            plan = result.next_plan  # a re-plan through the checkpoint just written
            restore = CheckpointStore(checkpointing.root).latest()
        except WorkerError as exc:
            noticed, noticed_s = time.monotonic(), time.time()
            failed_step = last_step + 1
            if is_recurring(exc) or checkpointing is None:
                raise
            failures.append(f"step {failed_step}: {exc}")
            if len(failures) > max_failures:
                raise WorkerError(
                    f"{len(failures)} failures, more than max_failures {max_failures}: "
                    + "; ".join(failures)
                ) from exc
            lost = pool.lost(probe=True) & {d.id for d in plan.devices}
            left_out.update(lost)
            new_plan = replan(left_out)
            # Before the job's first checkpoint, start again from where it started.
            restore = CheckpointStore(checkpointing.root).latest() or initial
            pending = {
                "started": noticed,
                "time_s": noticed_s,
                "error": str(exc),
                "failed_step": failed_step,
                "resumed_step": restore.step + 1 if restore is not None else 0,
                "lost": tuple(sorted(lost)),
                "old_plan": plan.to_dict(),
                "new_plan": new_plan.to_dict(),
            }
            plan = new_plan
    history = [by_step[s] for s in sorted(by_step)]
    final_ids = [d.id for d in history[-1].devices] if history else []
    final_plan_steps = [m for m in history if [d.id for d in m.devices] == final_ids]
    return TrainResult(
        steps_done=len(history),
        losses=[m.loss for m in history],
        val_losses=val_losses(history),
        step_times_s=[m.step_s for m in history],
        devices=median_devices(final_plan_steps),
        stopped=stopped,
        state=result.state,
    )
