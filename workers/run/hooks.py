"""What a run tells its caller, and what the caller may answer: one small protocol.

The service's job runner writes each event to the job store, ``hetsched simulate``
draws progress and keeps the events for its report, tests record them
(:class:`Recorder`). Every hook is called in the driver's thread, between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision
from workers.checkpoint import CheckpointInfo
from workers.records import HostBound, Recovery, StepMetrics


class RunHooks(Protocol):
    """The callbacks of one job; each does nothing (or allows everything) by default.

    Subclass and override what you need, or give any object of this shape (the
    service's, which must not import the workers before its first job). ``on_plan``
    and ``claim`` are asked by the run builder (:class:`workers.session.RunBuilder`)
    when it plans a recovery.
    """

    def on_step(self, metrics: StepMetrics) -> None:
        """A step finished. Steps run again after a recovery are reported again."""

    def on_checkpoint(self, info: CheckpointInfo, kept_steps: tuple[int, ...]) -> None:
        """``info`` was written; ``kept_steps`` are the job's checkpoints left after pruning."""

    def on_recovery(self, recovery: Recovery) -> None:
        """The job recovered from a failure (called after the first step it ran again)."""

    def on_replan(self, decision: ReplanDecision) -> None:
        """The job switches to ``decision.new_plan`` (in place, or through a checkpoint)."""

    def on_host_bound(self, notice: HostBound) -> None:
        """Simulated devices could not keep their GPUs' pace for
        :data:`workers.run.pace.HOST_BOUND_STEPS` steps in a row (said once per job)."""

    def on_plan(self, plan: Plan) -> None:
        """The builder planned the job again after a failure (or to take devices back)."""

    def should_stop(self) -> bool:
        """Asked between steps: True ends the run with a checkpoint, as a stop."""
        return False

    def claim(self, device_ids: Sequence[str]) -> list[str]:
        """Of the devices a re-plan may use, those the job may have (all, by default)."""
        return list(device_ids)


class NoHooks(RunHooks):
    """Every hook at its default: nobody listens."""


class Recorder(RunHooks):
    """Keeps everything a run reported, in the order it came; ``watch`` sees each step
    as it is recorded (a progress bar, a test that kills a worker at step 4)."""

    def __init__(self, watch: Callable[[StepMetrics], None] | None = None) -> None:
        self.watch = watch
        self.steps: list[StepMetrics] = []
        self.checkpoints: list[CheckpointInfo] = []
        self.recoveries: list[Recovery] = []
        self.replans: list[ReplanDecision] = []
        self.host_bound: list[HostBound] = []

    def on_step(self, metrics: StepMetrics) -> None:
        self.steps.append(metrics)
        if self.watch is not None:
            self.watch(metrics)

    def on_checkpoint(self, info: CheckpointInfo, kept_steps: tuple[int, ...]) -> None:
        self.checkpoints.append(info)

    def on_recovery(self, recovery: Recovery) -> None:
        self.recoveries.append(recovery)

    def on_replan(self, decision: ReplanDecision) -> None:
        self.replans.append(decision)

    def on_host_bound(self, notice: HostBound) -> None:
        self.host_bound.append(notice)
