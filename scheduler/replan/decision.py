"""Live re-planning: whether a job should switch plans now that its profile changed.

The job driver (DESIGN.md, "A job's life") calls :func:`decide_replan` when
:class:`~scheduler.replan.speed.SpeedMonitor` reports a device that got slower or
faster, or a device is lost or back. Every decision is a frozen record that
serialises to the job record and API (:meth:`ReplanDecision.to_dict`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cost.profile import Profile
from scheduler.planning.plan import DP_STRATEGIES, SHARDED_STRATEGIES, Plan
from scheduler.planning.planner import make_plan
from scheduler.replan.livecost import (
    live_profile,
    missing_devices,
    predict_step_s,
    predicted_busy_s,
)
from scheduler.replan.speed import SpeedChange, SpeedMonitor, SpeedReport, SpeedSettings

__all__ = [
    "ReplanDecision",
    "ReplanSettings",
    "SpeedChange",
    "SpeedMonitor",
    "SpeedReport",
    "SpeedSettings",
    "decide_replan",
    "live_profile",
    "predict_step_s",
    "predicted_busy_s",
    "switches_in_place",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplanSettings:
    """When a better plan is worth switching to."""

    min_relative_gain: float = 0.03
    """Least predicted step-time gain, as a share of the running plan's, for any switch."""
    in_place_cost_s: float = 0.0
    """Seconds an in-place data-parallel switch costs (new shapes, one slower step)."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_relative_gain < 1:
            raise ValueError(
                f"min_relative_gain: must be in [0, 1), got {self.min_relative_gain!r}"
            )
        if not self.in_place_cost_s >= 0:
            raise ValueError(f"in_place_cost_s: must be >= 0, got {self.in_place_cost_s!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplanDecision:
    """Whether to switch plans at ``step``, and the figures that decided it."""

    step: int
    switch: bool
    in_place: bool
    """True when the switch can apply between two steps without a checkpoint."""
    reason: str
    """One line for the job's log and record."""
    changes: tuple[SpeedChange, ...]
    """The speed changes that prompted the decision (empty for other events)."""
    lost: tuple[str, ...]
    """Devices the running plan uses that the live profile no longer has."""
    old_plan: Plan
    new_plan: Plan
    old_step_s: float
    """The running plan's predicted step under the live profile (``inf`` if it cannot run)."""
    new_step_s: float
    """The new plan's predicted step under the live profile."""
    steps_left: int
    switch_cost_s: float
    """Seconds the switch costs: ``in_place_cost_s`` in place, else checkpoint and restart."""

    @property
    def gain_per_step_s(self) -> float:
        return self.old_step_s - self.new_step_s

    @property
    def gain_s(self) -> float:
        """Predicted seconds saved over the remaining steps, before the switch cost."""
        return self.gain_per_step_s * self.steps_left

    @property
    def plan(self) -> Plan:
        """The plan to run from now on."""
        return self.new_plan if self.switch else self.old_plan

    def to_dict(self) -> dict[str, Any]:
        """The JSON record; ``inf`` becomes ``null``, ``device``/``factor`` the largest change."""
        main = max(
            self.changes, key=lambda c: abs(math.log(c.factor / c.previous_factor)), default=None
        )

        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "step": self.step,
            "switch": self.switch,
            "in_place": self.in_place,
            "reason": self.reason,
            "device": main.device if main else (self.lost[0] if self.lost else None),
            "factor": main.factor if main else None,
            "changes": [c.to_dict() for c in self.changes],
            "lost": list(self.lost),
            "old_split": {d.id: d.samples for d in self.old_plan.active},
            "new_split": {d.id: d.samples for d in self.new_plan.active},
            "predicted_old_step_s": finite(self.old_step_s),
            "predicted_new_step_s": self.new_step_s,
            "predicted_gain_per_step_s": finite(self.gain_per_step_s),
            "predicted_gain_s": finite(self.gain_s),
            "steps_left": self.steps_left,
            "switch_cost_s": self.switch_cost_s,
            "old_plan": self.old_plan.to_dict(),
            "new_plan": self.new_plan.to_dict(),
        }


def switches_in_place(old: Plan, new: Plan) -> bool:
    """Whether ``new`` can replace ``old`` between two steps, without a checkpoint.

    Both must be data parallel (every device holds the whole model) and
    ``new`` may only give samples to devices that run in ``old``: their
    replicas are current. A device left with no samples stays in the group
    and all-reduces zeros (the runtime's business), so its replica stays
    current too; a device that joins needs the weights, hence a checkpoint.
    Sharded plans (``fsdp``) never switch in place: new shards move model states
    (and new samples change the accumulation every rank must share), so they go
    through a checkpoint, as pipelines do.
    """
    if old.strategy not in DP_STRATEGIES or new.strategy not in DP_STRATEGIES:
        return False
    running = {d.id for d in old.active}
    return all(d.id in running for d in new.active)


def _candidates(current: Plan, live: Profile, global_batch: int, strategy: str) -> list[Plan]:
    """The best plan for ``live``, and for data parallelism the best one on the running devices."""
    best = make_plan(live, global_batch, strategy)
    if current.strategy not in DP_STRATEGIES or switches_in_place(current, best):
        return [best]
    running = [d.id for d in current.active if d.id in {p.id for p in live.devices}]
    same = current.strategy if strategy == "auto" else strategy
    if not running or same not in DP_STRATEGIES:
        return [best]
    return [make_plan(live.subset(running), global_batch, same), best]


def _same_split(a: Plan, b: Plan) -> bool:
    def split(p: Plan) -> set[tuple[Any, ...]]:
        # every device of a sharded plan counts: one with no samples still owns a shard
        devices = p.devices if p.strategy in SHARDED_STRATEGIES else p.active
        return {
            (d.id, d.samples, d.offset, d.micro_batch, d.layers, d.stage, d.shard, d.shard_group)
            for d in devices
        }

    return a.strategy == b.strategy and split(a) == split(b)


def decide_replan(
    current_plan: Plan,
    live_profile: Profile,
    *,
    global_batch: int,
    strategy: str,
    steps_left: int,
    switch_cost_s: float,
    step: int = 0,
    changes: Sequence[SpeedChange] = (),
    settings: ReplanSettings | None = None,
) -> ReplanDecision:
    """Plan ``global_batch`` under ``live_profile`` and decide whether to switch.

    The *same global batch* is planned with the live profile (same strategy
    rules; ``auto`` may switch strategy), the running plan's step time predicted
    under the same profile (:func:`scheduler.replan.livecost.predict_step_s`), and
    the job switches only when the switch pays for itself:

    - ``dp``, ``even`` and ``proportional`` switch **in place** between two steps
      (only each device's samples, offset, micro-batch and accumulation change;
      the global sample order does not), so the cost is about nothing
      (:attr:`ReplanSettings.in_place_cost_s`), but the predicted step must still
      be at least :attr:`ReplanSettings.min_relative_gain` faster, so that
      estimates wobbling inside their error never churn the split;
    - anything else (``pp``, ``hybrid``, ``fsdp``, a change of strategy, a device
      that was not in the running group) moves model states and goes through a checkpoint:
      the gain over the remaining steps must exceed ``switch_cost_s``, the
      checkpoint plus restart seconds the driver measured or estimated;
    - a running plan that uses a device the live profile no longer has cannot go
      on: the decision switches whatever the cost.

    ``strategy`` is what the job asked for (``auto`` may pick another concrete
    strategy); ``switch_cost_s`` the checkpoint-and-restart seconds of a switch
    that cannot happen in place. Raises :class:`~scheduler.errors.PlanError`
    when nothing fits the live profile.
    """
    settings = settings or ReplanSettings()
    lost = tuple(missing_devices(current_plan, live_profile))
    old_step_s = math.inf if lost else predict_step_s(current_plan, live_profile)

    def cost_of(plan: Plan) -> float:
        in_place = not lost and switches_in_place(current_plan, plan)
        return settings.in_place_cost_s if in_place else switch_cost_s

    def net_s(plan: Plan) -> float:
        if lost:  # every candidate restarts: the fastest wins
            return -plan.predicted_step_s
        return (old_step_s - plan.predicted_step_s) * steps_left - cost_of(plan)

    # in place first: it wins ties, and a slightly faster plan that needs a checkpoint
    # wins only when its extra gain over the remaining steps pays for the checkpoint
    new_plan = max(_candidates(current_plan, live_profile, global_batch, strategy), key=net_s)
    in_place = not lost and switches_in_place(current_plan, new_plan)
    verdict = _Verdict(
        what="; ".join(c.describe() for c in changes) or "profile changed",
        lost=lost,
        same_split=_same_split(current_plan, new_plan),
        old_step_s=old_step_s,
        new_step_s=new_plan.predicted_step_s,
        steps_left=steps_left,
        cost_s=cost_of(new_plan),
        in_place=in_place,
    )
    switch, reason = verdict.decide(settings)
    return ReplanDecision(
        step=step,
        switch=switch,
        in_place=in_place,
        reason=reason,
        changes=tuple(changes),
        lost=lost,
        old_plan=current_plan,
        new_plan=new_plan,
        old_step_s=old_step_s,
        new_step_s=new_plan.predicted_step_s,
        steps_left=steps_left,
        switch_cost_s=verdict.cost_s,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Verdict:
    """The figures a switch is judged on, and the judgement in words."""

    what: str
    """The changes that prompted the decision, for the reason."""
    lost: tuple[str, ...]
    same_split: bool
    old_step_s: float
    new_step_s: float
    steps_left: int
    cost_s: float
    in_place: bool

    def decide(self, settings: ReplanSettings) -> tuple[bool, str]:
        """Whether the new plan pays for its switch, and why."""
        what = self.what
        if self.lost:
            lost = ", ".join(self.lost)
            return True, f"{lost} lost: the running plan cannot go on; re-planned without"
        if self.same_split:
            return False, f"{what}: the best plan for the live profile is the running one"
        gain = self.old_step_s - self.new_step_s
        relative = gain / self.old_step_s if self.old_step_s > 0 else 0.0
        speeds = f"{self.old_step_s:.4g} s → {self.new_step_s:.4g} s per step"
        if relative < settings.min_relative_gain:
            return False, (
                f"{what}: a new plan is predicted only {relative:+.1%} faster ({speeds}), "
                f"under the {settings.min_relative_gain:.0%} minimum"
            )
        how = "in place" if self.in_place else "through a checkpoint"
        saved_s, steps = gain * self.steps_left, self.steps_left
        if saved_s <= self.cost_s:
            return False, (
                f"{what}: a new plan saves {saved_s:.3g} s over {steps} steps "
                f"({speeds}), not the {self.cost_s:.3g} s a switch {how} costs"
            )
        return True, (
            f"{what}: switching {how}, predicted {relative:.0%} faster ({speeds}), "
            f"{saved_s:.3g} s saved over {steps} steps for {self.cost_s:.3g} s"
        )
