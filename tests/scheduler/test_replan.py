"""Live re-planning: the speed monitor's reports and the switch decisions a job would see.

The monitor is driven here as the job driver drives it: each step the plan
runs on devices whose true speed follows a fault schedule, the measured busy
time is the prediction under the true speed times the host's noise (and the
prediction's usual 8 % optimism), and a report leads to a re-plan decision.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cost.profile import Profile, analytic_profile
from scheduler.hardware.cluster import load_cluster, parse_cluster
from scheduler.hardware.faults import FaultSchedule, parse_fault
from scheduler.models.presets import get_preset
from scheduler.planning.plan import Plan
from scheduler.planning.planner import make_plan
from scheduler.replan.decision import (
    ReplanDecision,
    ReplanSettings,
    SpeedChange,
    SpeedMonitor,
    SpeedSettings,
    decide_replan,
    live_profile,
    predict_step_s,
    predicted_busy_s,
    switches_in_place,
)

GLOBAL_BATCH = 64
SYSTEMATIC = 1.08
"""Measured busy times read this much above the prediction on the simulation."""


def local_sim(precision: str = "auto") -> Profile:
    """The bundled cluster; ``auto`` (16-bit where the type has it): the scenarios below
    were written with those figures."""
    cluster = load_cluster("deploy/clusters/local-sim.yaml")
    return analytic_profile(cluster, get_preset("gpt-tiny"), simulated=True, precision=precision)


def homogeneous() -> Profile:
    cluster = parse_cluster(
        {"name": "four", "nodes": [{"name": "n", "devices": [{"type": "A100-80GB", "count": 4}]}]}
    )
    return analytic_profile(cluster, get_preset("gpt-tiny"), simulated=True, precision="auto")


def big_mixed(precision: str = "auto") -> Profile:
    types = ["A100-80GB", "V100-16GB", "L4-24GB", "T4-16GB"]
    cluster = parse_cluster(
        {
            "name": "lab",
            "nodes": [
                {"name": f"n{i}", "devices": [{"type": t, "count": 4}]} for i, t in enumerate(types)
            ],
        }
    )
    return analytic_profile(cluster, get_preset("gpt2-large"), precision=precision)


def fastest(profile: Profile) -> str:
    return min(profile.devices, key=lambda d: d.per_sample_s).id


def uniform_noise(spread: float) -> Callable[[random.Random], float]:
    return lambda rng: rng.uniform(1 - spread, 1 + spread)


HOST_NOISE = uniform_noise(0.05)


@dataclass
class Run:
    """What a job driver saw: the monitor's changes, decisions and plans, step by step."""

    changes: list[SpeedChange] = field(default_factory=list)
    decisions: list[ReplanDecision] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)


def drive(
    profile: Profile,
    faults: list[str],
    *,
    steps: int,
    seed: int = 0,
    noise: Callable[[random.Random], float] = HOST_NOISE,
    strategy: str = "dp",
    replan: bool = True,
    blips: dict[int, float] | None = None,
    switch_cost_s: float = 5.0,
) -> Run:
    """Run ``steps`` steps against simulated devices slowed by ``faults``."""
    rng = random.Random(seed)
    schedule = FaultSchedule([parse_fault(f) for f in faults])
    monitor = SpeedMonitor(profile)
    plan = make_plan(profile, GLOBAL_BATCH, strategy)
    run = Run()
    for step in range(steps):
        truth = live_profile(profile, schedule.slowdowns(step))
        busy = predicted_busy_s(plan, truth)
        extra = (blips or {}).get(step, 1.0)
        measured = {d: b * SYSTEMATIC * noise(rng) * extra for d, b in busy.items()}
        run.plans.append(plan)
        report = monitor.observe(step, plan, measured)
        if report is None:
            continue
        run.changes += report.changes
        if replan:
            decision = decide_replan(
                plan,
                report.profile,
                global_batch=GLOBAL_BATCH,
                strategy=strategy,
                steps_left=steps - step - 1,
                switch_cost_s=switch_cost_s,
                step=step,
                changes=report.changes,
            )
            run.decisions.append(decision)
            plan = decision.plan
    return run


# --- the monitor ------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_a_3x_slowdown_of_the_fastest_device_is_reported_once_within_a_window(seed: int) -> None:
    profile = local_sim()
    slowed = fastest(profile)
    run = drive(profile, [f"{slowed}@10:slow=3"], steps=60, seed=seed)
    assert len(run.changes) == 1, [c.describe() for c in run.changes]
    change = run.changes[0]
    assert change.device == slowed
    window = SpeedSettings().window_steps
    assert 10 + window - 1 <= change.step <= 10 + window + 1
    assert change.factor == pytest.approx(3.0, rel=0.1)
    base = profile.device(slowed)
    assert change.per_sample_s == pytest.approx(base.per_sample_s * change.factor)
    assert change.fixed_s == pytest.approx(base.fixed_s * change.factor)
    assert len(run.decisions) == 1 and run.decisions[0].switch


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("cluster", [local_sim, homogeneous])
def test_steady_devices_under_15_percent_noise_never_report(
    seed: int, cluster: Callable[[], Profile]
) -> None:
    run = drive(cluster(), [], steps=100, seed=seed, noise=uniform_noise(0.15))
    assert run.changes == []


def test_a_steady_device_under_15_percent_noise_beside_a_slowed_one_never_reports() -> None:
    profile = local_sim()
    slowed = fastest(profile)
    for seed in range(10):
        run = drive(
            profile, [f"{slowed}@12:slow=3"], steps=100, seed=seed, noise=uniform_noise(0.15)
        )
        assert [c.device for c in run.changes] == [slowed]


def test_restoring_the_speed_reports_back_and_the_plan_returns() -> None:
    profile = local_sim()
    slowed = fastest(profile)
    run = drive(profile, [f"{slowed}@10:slow=3", f"{slowed}@35:restore"], steps=70)
    assert [(c.device, c.factor == 1.0) for c in run.changes] == [(slowed, False), (slowed, True)]
    assert run.changes[1].step > 35
    assert run.changes[1].previous_factor == pytest.approx(3.0, rel=0.1)
    first, during, after = run.plans[0], run.plans[30], run.plans[-1]
    split = {d.id: d.samples for d in first.active}
    assert {d.id: d.samples for d in during.active} != split
    assert {d.id: d.samples for d in after.active} == split


@pytest.mark.parametrize("height", [3.0, 10.0])
def test_single_slow_steps_are_not_reported(height: float) -> None:
    blips = {20: height, 31: height, 32: height, 50: height}
    run = drive(local_sim(), [], steps=70, blips=blips)
    assert run.changes == []


def test_a_device_that_alternates_between_speeds_never_reports() -> None:
    faults = [f"node-a/0@{s}:slow=3" if s % 2 else f"node-a/0@{s}:restore" for s in range(60)]
    run = drive(local_sim(), faults, steps=60)
    assert run.changes == []


def test_warm_up_steps_are_ignored() -> None:
    # three times slower during the first steps only: the cold start of a job
    run = drive(local_sim(), ["node-a/0@0:slow=3", "node-a/0@2:restore"], steps=40)
    assert run.changes == []


def test_a_speed_up_is_reported_too() -> None:
    profile = local_sim()
    run = drive(profile, ["node-a/1@12:slow=0.5"], steps=40)
    assert [(c.device, c.kind) for c in run.changes] == [("node-a/1", "faster")]
    assert run.changes[0].factor == pytest.approx(0.5, rel=0.1)


def test_without_replanning_the_monitor_still_reports_once() -> None:
    profile = local_sim()
    run = drive(profile, [f"{fastest(profile)}@10:slow=3"], steps=60, replan=False)
    assert len(run.changes) == 1


def test_the_live_profile_scales_only_the_changed_device() -> None:
    profile = local_sim()
    slowed = fastest(profile)
    monitor = SpeedMonitor(profile)
    plan = make_plan(profile, GLOBAL_BATCH, "dp")
    truth = live_profile(profile, {slowed: 3.0})
    reports = []
    for step in range(30):
        source = profile if step < 12 else truth
        reports.append(monitor.observe(step, plan, predicted_busy_s(plan, source)))
    report = next(r for r in reports if r is not None)
    for before, after in zip(profile.devices, report.profile.devices, strict=True):
        factor = 3.0 if before.id == slowed else 1.0
        assert after.per_sample_s == pytest.approx(before.per_sample_s * factor)
        assert after.capacity_bytes == before.capacity_bytes
    assert monitor.factors == {slowed: pytest.approx(3.0)}
    assert monitor.profile == report.profile


@pytest.mark.parametrize(
    ("field_name", "value"),
    [("window_steps", 0), ("threshold", 0.0), ("threshold", 1.5), ("warmup_steps", -1)],
)
def test_monitor_settings_name_the_bad_field(field_name: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"^{field_name}: must be"):
        SpeedSettings(**{field_name: value})  # type: ignore[arg-type]


# --- the cost of a running plan under a live profile ------------------------


@pytest.mark.parametrize("precision", ["auto", "fp32"])
@pytest.mark.parametrize("strategy", ["dp", "even", "proportional", "pp", "hybrid", "auto"])
def test_a_plan_costs_what_its_planner_predicted_under_its_own_profile(
    strategy: str, precision: str
) -> None:
    """fp32's larger activations make the planner recompute: a rebuilt stage once lost
    its recomputation mode and was costed without it."""
    for profile, batch in ((local_sim(precision), 64), (big_mixed(precision), 256)):
        plan = make_plan(profile, batch, strategy)
        assert predict_step_s(plan, profile) == pytest.approx(plan.predicted_step_s, rel=1e-9)
        busy = predicted_busy_s(plan, profile)
        assert busy == {d.id: pytest.approx(d.busy_s, rel=1e-9) for d in plan.active}


@pytest.mark.parametrize("strategy", ["dp", "pp", "hybrid"])
def test_slowing_a_busy_device_slows_the_running_plan(strategy: str) -> None:
    profile = big_mixed()
    plan = make_plan(profile, 256, strategy)
    busiest = max(plan.active, key=lambda d: d.busy_s).id
    slowed = live_profile(profile, {busiest: 3.0})
    assert predict_step_s(plan, slowed) > 1.5 * plan.predicted_step_s


# --- the decision -----------------------------------------------------------


def contiguous(plan: Plan) -> bool:
    position = 0
    for d in sorted(plan.active, key=lambda d: d.offset):
        if d.offset != position:
            return False
        position += d.samples
    return position == plan.global_batch


def slowed_decision(
    profile: Profile,
    strategy: str,
    slowdowns: dict[str, float],
    *,
    steps_left: int,
    switch_cost_s: float,
    settings: ReplanSettings | None = None,
) -> tuple[Plan, ReplanDecision]:
    """Plan GLOBAL_BATCH with ``strategy``, slow each device by its factor, and decide."""
    plan = make_plan(profile, GLOBAL_BATCH, strategy)
    decision = decide_replan(
        plan,
        live_profile(profile, slowdowns),
        global_batch=GLOBAL_BATCH,
        strategy=strategy,
        steps_left=steps_left,
        switch_cost_s=switch_cost_s,
        settings=settings,
    )
    return plan, decision


def test_the_new_plan_moves_samples_away_from_the_slowed_device() -> None:
    profile = local_sim()
    slowed = fastest(profile)
    plan, decision = slowed_decision(profile, "dp", {slowed: 3.0}, steps_left=50, switch_cost_s=5.0)
    assert decision.switch and decision.in_place
    assert {d.id for d in decision.new_plan.active} <= {d.id for d in plan.active}
    old = {d.id: d.samples for d in plan.active}
    new = {d.id: d.samples for d in decision.new_plan.active}
    assert new.get(slowed, 0) < old[slowed]
    assert decision.new_step_s < decision.old_step_s
    assert decision.new_plan.global_batch == GLOBAL_BATCH
    assert contiguous(decision.new_plan)
    assert "switching in place" in decision.reason


def test_a_free_checkpoint_lets_idle_devices_join() -> None:
    # gpt-tiny's analytic dp plan trains on node-a alone; slowing node-a/0 makes
    # node-b worth its all-reduce (or a move to it), which needs a checkpoint to
    # bring its replicas in
    profile = local_sim()
    plan = make_plan(profile, GLOBAL_BATCH, "dp")
    live = live_profile(profile, {fastest(profile): 3.0})
    kwargs = {"global_batch": GLOBAL_BATCH, "strategy": "dp", "steps_left": 50}
    free = decide_replan(plan, live, switch_cost_s=0.0, **kwargs)  # type: ignore[arg-type]
    costly = decide_replan(plan, live, switch_cost_s=5.0, **kwargs)  # type: ignore[arg-type]
    assert free.switch and not free.in_place
    assert "node-b" in {
        d.node for d in live.devices if d.id in {e.id for e in free.new_plan.active}
    }
    assert costly.switch and costly.in_place
    assert free.new_step_s < costly.new_step_s < costly.old_step_s


@settings(max_examples=40, deadline=None)
@given(
    device=st.sampled_from(["node-a/0", "node-a/1", "node-b/0", "node-b/1"]),
    factor=st.floats(min_value=0.2, max_value=6.0),
    strategy=st.sampled_from(["dp", "even", "proportional"]),
)
def test_in_place_replans_keep_the_global_batch_and_contiguous_offsets(
    device: str, factor: float, strategy: str
) -> None:
    _, decision = slowed_decision(
        local_sim(), strategy, {device: factor}, steps_left=100, switch_cost_s=1e9
    )
    assert decision.plan.global_batch == GLOBAL_BATCH
    assert sum(d.samples for d in decision.plan.active) == GLOBAL_BATCH
    assert contiguous(decision.plan)
    if decision.switch:
        assert decision.in_place, "dp-family switches never need a checkpoint"
        assert decision.new_step_s < decision.old_step_s


def test_even_splits_do_not_follow_speed_so_they_never_switch() -> None:
    profile = local_sim()
    _, decision = slowed_decision(
        profile, "even", {fastest(profile): 3.0}, steps_left=50, switch_cost_s=0.0
    )
    assert not decision.switch
    assert "the running one" in decision.reason


def test_a_small_gain_does_not_churn_the_split() -> None:
    profile = local_sim()
    slowdowns = {fastest(profile): 1.04}
    _, decision = slowed_decision(profile, "dp", slowdowns, steps_left=10_000, switch_cost_s=0.0)
    assert not decision.switch
    assert "minimum" in decision.reason or "the running one" in decision.reason
    _, eager = slowed_decision(
        profile,
        "dp",
        slowdowns,
        steps_left=10_000,
        switch_cost_s=0.0,
        settings=ReplanSettings(min_relative_gain=0.0),
    )
    assert eager.switch or eager.new_step_s >= eager.old_step_s


def test_a_pipeline_switch_must_pay_for_its_checkpoint() -> None:
    profile = big_mixed()
    plan = make_plan(profile, 256, "pp")
    busiest = max(plan.active, key=lambda d: d.busy_s).id
    live = live_profile(profile, {busiest: 3.0})
    kwargs = {"global_batch": 256, "strategy": "pp", "switch_cost_s": 30.0}
    few = decide_replan(plan, live, steps_left=1, **kwargs)  # type: ignore[arg-type]
    many = decide_replan(plan, live, steps_left=10_000, **kwargs)  # type: ignore[arg-type]
    assert not few.in_place and not many.in_place
    assert few.gain_per_step_s == pytest.approx(many.gain_per_step_s) and few.gain_per_step_s > 0
    assert not few.switch and "not the 30 s a switch through a checkpoint costs" in few.reason
    assert many.switch and many.plan is many.new_plan
    assert busiest not in {d.id for d in many.new_plan.active} or (
        next(d for d in many.new_plan.active if d.id == busiest).busy_s
        < next(d for d in plan.active if d.id == busiest).busy_s * 3
    )


def test_only_dp_plans_over_running_devices_switch_in_place() -> None:
    profile = local_sim()
    dp = make_plan(profile, GLOBAL_BATCH, "dp")  # gpt-tiny: node-a alone, no inter-node ring
    node_a = profile.subset(["node-a/0", "node-a/1"])
    assert switches_in_place(dp, make_plan(node_a, GLOBAL_BATCH, "proportional"))
    assert switches_in_place(dp, make_plan(profile.subset(["node-a/1"]), GLOBAL_BATCH, "dp"))
    assert not switches_in_place(dp, make_plan(profile, GLOBAL_BATCH, "even")), "node-b joins"
    pp = make_plan(node_a, GLOBAL_BATCH, "pp")
    assert not switches_in_place(dp, pp) and not switches_in_place(pp, pp)


def test_auto_replans_with_the_auto_rules() -> None:
    profile = big_mixed()
    plan = make_plan(profile, 256, "auto")
    live = live_profile(profile, {d.id: 4.0 for d in profile.devices if d.node != "n0"})
    decision = decide_replan(
        plan, live, global_batch=256, strategy="auto", steps_left=10_000, switch_cost_s=0.0
    )
    assert decision.new_plan.predicted_step_s == make_plan(live, 256, "auto").predicted_step_s
    assert decision.switch
    assert decision.in_place == switches_in_place(plan, decision.new_plan)
    assert decision.new_step_s < decision.old_step_s


def test_a_lost_device_forces_a_switch_and_the_record_is_json() -> None:
    profile = local_sim()
    plan = make_plan(profile, GLOBAL_BATCH, "dp")
    lost = plan.active[0].id
    live = profile.subset([d.id for d in profile.devices if d.id != lost])
    decision = decide_replan(
        plan, live, global_batch=GLOBAL_BATCH, strategy="dp", steps_left=3, switch_cost_s=1e6
    )
    assert decision.switch and not decision.in_place
    assert decision.lost == (lost,)
    assert lost not in {d.id for d in decision.new_plan.active}
    record = json.loads(json.dumps(decision.to_dict(), allow_nan=False))
    assert record["predicted_old_step_s"] is None
    assert record["device"] == lost and record["lost"] == [lost]


def test_the_record_says_which_device_changed_by_how_much() -> None:
    profile = local_sim()
    run = drive(profile, [f"{fastest(profile)}@10:slow=3"], steps=40)
    record = json.loads(json.dumps(run.decisions[0].to_dict(), allow_nan=False))
    assert record["step"] == run.changes[0].step
    assert record["device"] == fastest(profile)
    assert record["factor"] == pytest.approx(3.0, rel=0.1)
    assert record["switch"] and record["in_place"]
    assert sum(record["new_split"].values()) == sum(record["old_split"].values()) == GLOBAL_BATCH
    assert record["predicted_gain_s"] > 0
    assert record["predicted_new_step_s"] < record["predicted_old_step_s"]
    assert record["new_plan"]["global_batch"] == GLOBAL_BATCH


@pytest.mark.parametrize("strategy", ["pp", "hybrid"])
def test_a_pipeline_stage_slowed_3x_is_reported_once_and_replanned_through_a_checkpoint(
    strategy: str,
) -> None:
    profile = big_mixed()
    plan = make_plan(profile, GLOBAL_BATCH, strategy)
    busiest = max(plan.active, key=lambda d: d.busy_s).id
    run = drive(profile, [f"{busiest}@10:slow=3"], steps=60, strategy=strategy, switch_cost_s=5.0)
    assert [c.device for c in run.changes] == [busiest]
    assert run.changes[0].step <= 10 + SpeedSettings().window_steps
    decision = run.decisions[0]
    assert decision.switch and not decision.in_place
    assert decision.switch_cost_s == 5.0
    assert decision.gain_s > decision.switch_cost_s
    assert run.plans[-1].strategy == strategy and run.plans[-1].global_batch == GLOBAL_BATCH


def test_no_steps_left_means_no_switch_unless_a_device_is_lost() -> None:
    profile = local_sim()
    plan, decision = slowed_decision(
        profile, "dp", {fastest(profile): 3.0}, steps_left=0, switch_cost_s=5.0
    )
    assert not decision.switch and decision.plan is plan


@pytest.mark.parametrize(
    ("field_name", "value"), [("min_relative_gain", -0.1), ("in_place_cost_s", -1.0)]
)
def test_replan_settings_name_the_bad_field(field_name: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"^{field_name}: must be"):
        ReplanSettings(**{field_name: value})  # type: ignore[arg-type]


def test_after_a_loss_the_fastest_plan_on_the_rest_is_chosen() -> None:
    profile = local_sim()
    plan = make_plan(profile, GLOBAL_BATCH, "dp")  # node-a/0 and node-a/1
    live = profile.subset(["node-a/1", "node-b/0", "node-b/1"])
    decision = decide_replan(
        plan, live, global_batch=GLOBAL_BATCH, strategy="dp", steps_left=100, switch_cost_s=5.0
    )
    assert decision.lost == ("node-a/0",)
    assert decision.new_step_s == make_plan(live, GLOBAL_BATCH, "dp").predicted_step_s
    assert "node-a/0 lost" in decision.reason
