"""Live re-planning in the driver: when a device's speed changes, the split follows it.

Data-parallel plans switch in place between two steps (the global sample order is
untouched, so the loss curve is the one without re-planning); pipelines switch
through a checkpoint (:class:`workers.run.job.Job` restarts from it on the new plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cost.profile import Profile
from scheduler.planning.plan import Plan
from scheduler.replan.decision import ReplanDecision, ReplanSettings, decide_replan
from scheduler.replan.speed import SpeedMonitor, SpeedSettings
from workers.records import StepMetrics
from workers.run.pace import host_bound


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveReplanning:
    """What a job's re-planning needs besides its plan."""

    profile: Profile
    """The profile the job's plan was made from; speed factors are relative to it."""
    strategy: str
    """The strategy the job asked for (``auto`` may switch to another)."""
    total_steps: int
    speed: SpeedSettings = field(default_factory=SpeedSettings)
    rules: ReplanSettings = field(default_factory=ReplanSettings)


class Replanner:
    """Owns a job's speed monitor: each step the run hands it the plan that ran and every
    device's measured busy time; its :class:`scheduler.replan.speed.SpeedMonitor` says
    when a device's speed changed for good (a robust level with hysteresis: never one
    slow step, never an oscillation), and :func:`scheduler.replan.decision.decide_replan`
    switches only when the predicted gain over the remaining steps beats the cost."""

    def __init__(self, config: LiveReplanning) -> None:
        self.config = config
        self.monitor = SpeedMonitor(config.profile, config.speed)

    def observe(
        self, metrics: StepMetrics, plan: Plan, *, switch_cost_s: float
    ) -> ReplanDecision | None:
        """A decision when a device's speed changed for good at this step, else None.

        A device whose compute overran its pacing this step is left out of it: its time
        is the host's (:func:`workers.run.pace.host_bound`), not a GPU that
        slowed, and re-planning around it would only move work between busy cores."""
        busy = {d.id: d.busy_s for d in metrics.devices if not host_bound(d)}
        report = self.monitor.observe(metrics.step, plan, busy)
        if report is None:
            return None
        return decide_replan(
            plan,
            report.profile,
            global_batch=plan.global_batch,
            strategy=self.config.strategy,
            steps_left=max(0, self.config.total_steps - metrics.step - 1),
            switch_cost_s=switch_cost_s,
            step=metrics.step,
            changes=report.changes,
            settings=self.config.rules,
        )
