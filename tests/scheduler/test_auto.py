"""``auto``: the fastest feasible strategy, with notes that say why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.cost.profile import analytic_profile
from scheduler.errors import PlanError
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.auto import PREFERENCE_MARGIN
from scheduler.planning.planner import STRATEGIES, make_plan
from tests.scheduler.clusters import MIXED


def test_strategies_offered():
    assert STRATEGIES[0] == "auto"
    assert {"dp", "even", "proportional", "pp", "hybrid"} <= set(STRATEGIES)


@pytest.mark.parametrize("model", ["gpt-tiny", "gpt2-small", "gpt2-large", "gpt2-xl"])
def test_auto_picks_the_fastest(model: str):
    profile = analytic_profile(parse_cluster(MIXED), get_preset(model))
    plan = make_plan(profile, 64, "auto")
    candidates = {}
    for name in ("dp", "fsdp", "pp", "hybrid"):
        try:
            candidates[name] = make_plan(profile, 64, name).predicted_step_s
        except PlanError:
            continue
    assert plan.strategy in candidates
    assert plan.predicted_step_s == pytest.approx(candidates[plan.strategy])
    assert plan.predicted_step_s <= min(candidates.values()) * (1 + PREFERENCE_MARGIN)
    assert plan.notes[0].startswith("auto considered:")
    for name in candidates:
        assert name in plan.notes[0]
        assert plan.baselines[name].predicted_step_s == pytest.approx(candidates[name])
    assert plan.notes[1].startswith(f"{plan.strategy} wins")


@pytest.mark.parametrize("sharding", [True, False])
def test_auto_splits_the_model_when_it_does_not_fit_small_devices(sharding: bool):
    """gpt2-xl fits only the A100s whole: auto shards it (fsdp) or, with no sharding
    figures in the profile, pipelines it, and uses all six devices either way."""
    profile = analytic_profile(
        parse_cluster(MIXED), get_preset("gpt2-xl"), efficiency=0.5, precision="auto"
    )
    # One share of peak for every device: a planner property, not one of the speed
    # model's (whose sustained rates make these T4s and L4s barely worth a stage).
    if not sharding:
        profile = replace(profile, sharding=None)
    plan = make_plan(profile, 64, "auto")
    assert plan.strategy in (("fsdp",) if sharding else ("pp", "hybrid"))
    assert len(plan.active) == 6
    assert "dp uses 2" in plan.notes[1]


def test_auto_reports_every_infeasible_strategy():
    a100s = {"name": "a100s", "nodes": MIXED["nodes"][:1]}
    profile = analytic_profile(parse_cluster(a100s), get_preset("llama-13b"))
    with pytest.raises(PlanError, match="dp: .*fsdp: .*pp: .*hybrid: "):
        make_plan(profile, 8, "auto")


def test_unknown_strategy_lists_auto():
    profile = analytic_profile(parse_cluster(MIXED), get_preset("gpt-tiny"))
    with pytest.raises(PlanError, match="allowed: auto, dp"):
        make_plan(profile, 8, "magic")
