"""The pp planner: exact against brute force, memory respected, order and chain chosen."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cost.profile import (
    DeviceProfile,
    LayerCost,
    LayerProfile,
    Profile,
    RecomputeCost,
    analytic_profile,
)
from scheduler.errors import PlanError
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.pipeline import plan_pp
from scheduler.planning.planner import make_plan
from scheduler.planning.stages import (
    exchange_s,
    in_flight_1f1b,
    partition,
    stage_bytes,
    stage_time_s,
)
from tests.scheduler.clusters import MIXED
from tests.support import unit_device


def _cost(draw: st.DrawFn) -> LayerCost:
    return LayerCost(
        fixed_s=draw(st.floats(0, 0.01)),
        per_sample_s=draw(st.floats(1e-4, 0.05)),
        static_bytes=draw(st.integers(0, 60)),
        per_sample_bytes=draw(st.integers(0, 20)),
    )


@st.composite
def chains(draw: st.DrawFn) -> tuple[list[DeviceProfile], int, int]:
    num_blocks = draw(st.integers(1, 6))
    num_devices = draw(st.integers(1, 4))
    devices = []
    for i in range(num_devices):
        block = _cost(draw)
        if draw(st.booleans()):  # full recomputation: less kept, more time, a transient
            block = replace(
                block,
                full=RecomputeCost(
                    per_sample_bytes=draw(st.integers(0, block.per_sample_bytes)),
                    per_sample_s=block.per_sample_s * 4 / 3,
                    transient_bytes_per_sample=draw(st.integers(0, 20)),
                ),
            )
        lp = LayerProfile(
            num_blocks=num_blocks,
            embed=_cost(draw),
            block=block,
            head=_cost(draw),
            boundary_bytes_per_sample=8,
        )
        devices.append(unit_device(f"n/{i}", capacity_bytes=draw(st.integers(20, 400)), layers=lp))
    return devices, draw(st.integers(1, 3)), draw(st.integers(1, 6))


def brute_force(devices: list[DeviceProfile], micro_batch: int, m: int) -> float:
    """Slowest stage of the best split, trying every contiguous split."""
    p = len(devices)
    num_blocks = devices[0].layers.num_blocks  # type: ignore[union-attr]
    flight = in_flight_1f1b(p, m)
    best = math.inf
    for cuts in itertools.combinations_with_replacement(range(num_blocks + 1), p - 1):
        bounds = [0, *cuts, num_blocks]
        worst = 0.0
        for s, d in enumerate(devices):
            k = bounds[s + 1] - bounds[s]
            first, last = s == 0, s == p - 1
            if k == 0 and not first and not last:
                worst = math.inf
                break
            lp = d.layers
            assert lp is not None
            fitting = [
                stage_time_s(lp, k, micro_batch, first=first, last=last, recompute=o.recompute)
                for o in lp.block.options()
                if stage_bytes(
                    lp,
                    k,
                    micro_batch,
                    in_flight=flight[s],
                    first=first,
                    last=last,
                    recompute=o.recompute,
                )
                <= d.capacity_bytes
            ]
            if not fitting:
                worst = math.inf
                break
            worst = max(worst, min(fitting) + exchange_s(first=first, last=last))
        best = min(best, worst)
    return best


@settings(max_examples=300, deadline=None)
@given(chains())
def test_partition_equals_brute_force_for_a_fixed_order(case):
    devices, micro_batch, m = case
    chain = partition(devices, micro_batch=micro_batch, in_flight=in_flight_1f1b(len(devices), m))
    expected = brute_force(devices, micro_batch, m)
    if math.isinf(expected):
        assert chain is None
        return
    assert chain is not None
    assert chain.slowest_s == pytest.approx(expected, rel=1e-9)
    # a valid split: contiguous, covering every block, within every device's memory
    assert chain.stages[0].first == 0
    assert chain.stages[-1].last == devices[0].layers.num_blocks  # type: ignore[union-attr]
    for a, b in zip(chain.stages, chain.stages[1:], strict=False):
        assert a.last == b.first
    for stage in chain.stages:
        assert stage.peak_bytes <= stage.device.capacity_bytes


def test_in_flight_follows_1f1b():
    assert in_flight_1f1b(4, 8) == [4, 3, 2, 1]
    assert in_flight_1f1b(4, 2) == [2, 2, 2, 1]


def test_gpt2_xl_does_not_fit_small_gpus_under_dp_but_pp_uses_them():
    profile = analytic_profile(parse_cluster(MIXED), get_preset("gpt2-xl"), efficiency=0.5)
    # One share of peak for every device: a planner property, not one of the speed
    # model's (whose sustained rates make these T4s and L4s barely worth a stage).
    dp = make_plan(profile, 64, "dp")
    assert {e.id for e in dp.excluded} == {"small/0", "small/1", "small/2", "small/3"}
    pp = make_plan(profile, 64, "pp")
    assert {d.id for d in pp.active} == {d.id for d in profile.devices}
    assert pp.predicted_step_s < dp.predicted_step_s
    assert pp.baselines["dp"].predicted_step_s == pytest.approx(dp.predicted_step_s)
    # the 80 GB devices take the early, activation-heavy stages
    stages = sorted(pp.devices, key=lambda d: d.stage or 0)
    assert {stages[0].id, stages[1].id} == {"big/0", "big/1"}


def test_pp_plan_is_a_valid_pipeline_within_memory():
    profile = analytic_profile(parse_cluster(MIXED), get_preset("gpt2-large"))
    plan = make_plan(profile, 48, "pp")
    stages = sorted(plan.devices, key=lambda d: d.stage or 0)
    assert [d.stage for d in stages] == list(range(len(stages)))
    assert stages[0].layers is not None and stages[0].layers[0] == 0
    assert stages[-1].layers is not None and stages[-1].layers[1] == 36
    for a, b in zip(stages, stages[1:], strict=False):
        assert a.layers is not None and b.layers is not None and a.layers[1] == b.layers[0]
    for d in plan.devices:
        assert d.samples == 48 and d.pipeline == 0
        assert d.peak_bytes <= profile.device(d.id).capacity_bytes
        assert d.micro_batch * d.accum_steps >= 48
    # predicted step: the 1F1B formula over the stages' busy times
    assert plan.predicted_step_s == pytest.approx(plan.compute_s + plan.comm_s)
    assert plan.compute_s >= max(d.busy_s for d in plan.devices)


def test_pp_without_layer_figures_is_a_one_line_error():
    profile = analytic_profile(parse_cluster(MIXED), get_preset("gpt-tiny"))
    bare = Profile(
        model="gpt-tiny",
        devices=tuple(
            replace(d, layers=None, micro_batch_limit=None, selective=None, full=None)
            for d in profile.devices
        ),
    )
    with pytest.raises(PlanError, match="per-layer"):
        plan_pp(bare, 8)


def test_pp_says_why_nothing_fits():
    # llama-13b's 208 GB of model states exceed two A100-80GBs whatever the recomputation.
    a100s = {"name": "a100s", "nodes": MIXED["nodes"][:1]}
    profile = analytic_profile(parse_cluster(a100s), get_preset("llama-13b"))
    with pytest.raises(PlanError, match="no pipeline over 2 devices fits: model states 208.3 GB"):
        plan_pp(profile, 8)


def test_plan_json_round_trip_keeps_layers_and_stage():
    from scheduler.planning.plan import plan_from_dict

    profile = analytic_profile(parse_cluster(MIXED), get_preset("gpt2-xl"))
    plan = make_plan(profile, 16, "pp")
    again = plan_from_dict(plan.to_dict())
    assert [(d.id, d.layers, d.stage, d.pipeline) for d in again.devices] == [
        (d.id, d.layers, d.stage, d.pipeline) for d in plan.devices
    ]
