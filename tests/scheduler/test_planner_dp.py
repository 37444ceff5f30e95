"""The data-parallel planners: optimality against brute force, feasibility, baselines, errors.

The cost model is re-implemented here from DESIGN.md on purpose, so the
planner is checked against the formula a user reads, not against itself.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cost.costmodel import ring_allreduce_s, slowest_link_gbps
from scheduler.cost.profile import DeviceProfile, Profile, analytic_profile
from scheduler.errors import PlanError
from scheduler.hardware.capacity import catalogue_budget_bytes
from scheduler.hardware.catalogue import lookup
from scheduler.hardware.cluster import Links, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.dp import (
    optimal_split,
    plan_dp,
    plan_even,
    plan_proportional,
    proportional_split,
)
from scheduler.planning.plan import MAX_GLOBAL_BATCH, Plan, plan_from_dict
from scheduler.planning.planner import STRATEGIES, make_plan
from scheduler.units import format_bytes

ALL_STRATEGIES = ("dp", "even", "proportional")


def device(
    name: str,
    *,
    fixed_s: float = 0.0,
    per_sample_s: float = 0.1,
    max_micro: int = 64,
    node: str | None = None,
    static_bytes: int = 1000,
    per_sample_bytes: int = 10,
) -> DeviceProfile:
    """A device whose memory fits exactly ``max_micro`` samples (0: not even one)."""
    return DeviceProfile(
        id=name,
        node=node or name.split("/")[0],
        type="X",
        capacity_bytes=static_bytes + max_micro * per_sample_bytes + per_sample_bytes // 2,
        static_bytes=static_bytes,
        per_sample_bytes=per_sample_bytes,
        fixed_s=fixed_s,
        per_sample_s=per_sample_s,
    )


def profile_of(*devices: DeviceProfile, gradient_bytes: int = 0, **links: float) -> Profile:
    return Profile(
        model="m", devices=tuple(devices), links=Links(**links), gradient_bytes=gradient_bytes
    )


def model_busy_s(d: DeviceProfile, samples: int) -> float:
    """DESIGN.md: ``ceil(n/m)·fixed_s + n·per_sample_s`` with the largest fitting ``m``."""
    if samples == 0:
        return 0.0
    m = (d.capacity_bytes - d.static_bytes) // d.per_sample_bytes
    return math.ceil(samples / m) * d.fixed_s + samples * d.per_sample_s


def brute_force_busy_s(devices: list[DeviceProfile], global_batch: int) -> float:
    """The smallest slowest-device busy time over every integer split."""
    best = math.inf
    for split in itertools.product(range(global_batch + 1), repeat=len(devices) - 1):
        last = global_batch - sum(split)
        if last < 0:
            continue
        samples = [*split, last]
        best = min(best, max(model_busy_s(d, n) for d, n in zip(devices, samples, strict=True)))
    return best


def assert_feasible(plan: Plan, profile: Profile, global_batch: int) -> None:
    """What a runtime relies on: every sample placed once, in order, within memory."""
    assert plan.global_batch == global_batch
    assert sum(d.samples for d in plan.devices) == global_batch
    offset = 0
    for entry in plan.devices:
        d = profile.device(entry.id)
        assert entry.offset == offset, "devices take contiguous slices in order"
        offset += entry.samples
        assert entry.peak_bytes == d.static_bytes + entry.micro_batch * d.per_sample_bytes
        assert entry.peak_bytes <= d.capacity_bytes
        if entry.samples == 0:
            assert (entry.micro_batch, entry.accum_steps, entry.busy_s) == (0, 0, 0.0)
            continue
        assert entry.micro_batch * entry.accum_steps >= entry.samples
        assert (entry.micro_batch - 1) * entry.accum_steps < entry.samples, "balanced"
        assert entry.busy_s == pytest.approx(model_busy_s(d, entry.samples), rel=1e-12)
    assert plan.compute_s == max(e.busy_s for e in plan.devices)
    assert plan.predicted_step_s == pytest.approx(plan.compute_s + plan.comm_s)
    planned = {e.id for e in plan.devices} | {e.id for e in plan.excluded}
    assert planned == {d.id for d in profile.devices}, "every device is planned or excluded"


# --- optimality: property test against brute force --------------------------


@st.composite
def small_profiles(draw: Any) -> tuple[Profile, int]:
    global_batch = draw(st.integers(1, 12))
    num_devices = draw(st.integers(2, 4))
    times = st.floats(0.0, 1.0, allow_subnormal=False)
    devices = []
    for i in range(num_devices):
        devices.append(
            device(
                f"n{i % 2}/{i}",
                fixed_s=draw(st.one_of(st.just(0.0), times)),
                # Wide range: a device 100x slower than another is best left idle.
                per_sample_s=draw(st.floats(0.001, 1.0, allow_subnormal=False)),
                # 0: cannot hold the model; small values force accumulation.
                max_micro=draw(st.integers(0, global_batch + 2)),
                static_bytes=draw(st.integers(0, 10_000)),
                per_sample_bytes=draw(st.integers(1, 500)),
            )
        )
    return profile_of(*devices), global_batch


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_profiles())
def test_dp_equals_brute_force_optimum(case: tuple[Profile, int]) -> None:
    profile, global_batch = case
    usable = [d for d in profile.devices if d.max_micro_batch() >= 1]
    if not usable:
        with pytest.raises(PlanError, match="no device can hold the model"):
            plan_dp(profile, global_batch)
        return
    plan = plan_dp(profile, global_batch)
    assert_feasible(plan, profile, global_batch)
    assert plan.compute_s == pytest.approx(brute_force_busy_s(usable, global_batch), rel=1e-9)
    assert len(plan.excluded) == len(profile.devices) - len(usable)


@settings(max_examples=100, deadline=None)
@given(small_profiles(), st.integers(0, 10**9), st.floats(0.1, 1000.0))
def test_every_strategy_is_feasible_and_dp_is_never_slower(
    case: tuple[Profile, int], gradient_bytes: int, inter_node_gbps: float
) -> None:
    base, global_batch = case
    profile = profile_of(
        *base.devices, gradient_bytes=gradient_bytes, inter_node_gbps=inter_node_gbps
    )
    if not any(d.max_micro_batch() >= 1 for d in profile.devices):
        return
    plans = {s: make_plan(profile, global_batch, s) for s in ALL_STRATEGIES}
    for plan in plans.values():
        assert_feasible(plan, profile, global_batch)
    dp = plans["dp"]
    for name in ("even", "proportional"):
        assert dp.predicted_step_s <= plans[name].predicted_step_s * (1 + 1e-12)
        assert dp.baselines[name].predicted_step_s == plans[name].predicted_step_s


def test_slow_device_is_left_idle() -> None:
    fast = device("a/0", fixed_s=0.01, per_sample_s=0.01)
    slow = device("a/1", fixed_s=5.0, per_sample_s=1.0)
    plan = plan_dp(profile_of(fast, slow), 8)
    assert [d.samples for d in plan.devices] == [8, 0]
    assert plan.compute_s == pytest.approx(0.01 + 8 * 0.01)


def test_memory_cap_forces_accumulation_and_shifts_work() -> None:
    # Same speed, but the tight device pays fixed_s per micro-batch of 2.
    roomy = device("a/0", fixed_s=0.1, per_sample_s=0.1, max_micro=64)
    tight = device("a/1", fixed_s=0.1, per_sample_s=0.1, max_micro=2)
    plan = plan_dp(profile_of(roomy, tight), 12)
    by_id = {d.id: d for d in plan.devices}
    assert by_id["a/1"].micro_batch <= 2
    assert by_id["a/1"].accum_steps == math.ceil(by_id["a/1"].samples / 2)
    assert by_id["a/0"].samples > by_id["a/1"].samples
    assert plan.compute_s == pytest.approx(brute_force_busy_s([roomy, tight], 12))


def test_optimal_split_matches_plan() -> None:
    devices = [device("a/0", per_sample_s=0.1), device("a/1", per_sample_s=0.3)]
    assert optimal_split(devices, 8) == [6, 2]


# --- baselines ------------------------------------------------------------------


@pytest.mark.parametrize(("num_devices", "global_batch"), [(3, 10), (4, 4), (5, 3), (7, 100)])
def test_even_shares_differ_by_at_most_one(num_devices: int, global_batch: int) -> None:
    devices = [device(f"a/{i}", per_sample_s=0.1 * (i + 1)) for i in range(num_devices)]
    plan = plan_even(profile_of(*devices), global_batch)
    shares = [d.samples for d in plan.devices]
    assert sum(shares) == global_batch
    assert max(shares) - min(shares) <= 1


def test_proportional_follows_speed() -> None:
    devices = [device(f"a/{i}", per_sample_s=s) for i, s in enumerate([0.1, 0.2, 0.4])]
    plan = plan_proportional(profile_of(*devices), 70)
    assert [d.samples for d in plan.devices] == [40, 20, 10]
    assert proportional_split([1.0, 1.0, 1.0], 10) == [4, 3, 3]
    assert proportional_split([3.0, 1.0], 5) == [4, 1]


def test_make_plan_reports_baselines() -> None:
    devices = [device("a/0", per_sample_s=0.1), device("a/1", per_sample_s=0.4)]
    profile = profile_of(*devices)
    plan = make_plan(profile, 10)
    assert set(plan.baselines) == {"even", "proportional"}
    even = plan_even(profile, 10)
    assert plan.baselines["even"].predicted_step_s == even.predicted_step_s
    assert plan.baselines["even"].predicted_samples_per_s == even.predicted_samples_per_s
    assert plan.predicted_samples_per_s > plan.baselines["even"].predicted_samples_per_s


# --- exclusions and errors -----------------------------------------------------


def test_excluded_devices_carry_reasons_with_numbers() -> None:
    cluster = parse_cluster(
        {
            "name": "t",
            "nodes": [{"name": "n", "devices": [{"type": "H100-80GB"}, {"type": "T4-16GB"}]}],
        }
    )
    profile = analytic_profile(cluster, get_preset("gpt2-xl"))
    plan = make_plan(profile, 16)
    assert [d.id for d in plan.devices] == ["n/0"]
    (excluded,) = plan.excluded
    assert excluded.id == "n/1"
    assert re.fullmatch(
        r"model states \d+\.\d GB( \+ one sample \d+\.\d [GM]B)? exceed capacity \d+\.\d GB",
        excluded.reason,
    ), excluded.reason
    capacity = format_bytes(catalogue_budget_bytes(lookup("T4-16GB").memory_bytes))
    assert "24.9 GB" in excluded.reason and f"capacity {capacity}" in excluded.reason


def test_one_sample_too_many_is_a_different_reason() -> None:
    d = device("a/0", max_micro=0, static_bytes=10**9, per_sample_bytes=10**9)
    plan = make_plan(profile_of(d, device("a/1")), 4)
    assert plan.excluded[0].reason == (
        "model states 1.0 GB + one sample 1.0 GB exceed capacity 1.5 GB"
    )


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8", MAX_GLOBAL_BATCH + 1, 10**20])
def test_a_global_batch_out_of_range_is_a_plan_error(bad: Any) -> None:
    profile = profile_of(device("a/0"))
    for strategy in ALL_STRATEGIES:
        with pytest.raises(
            PlanError, match=r"global_batch: must be an integer from 1 to 1,000,000, got"
        ):
            make_plan(profile, bad, strategy)


def test_nothing_fits_is_a_plan_error_naming_devices() -> None:
    cluster = parse_cluster(
        {"name": "t", "nodes": [{"name": "n", "devices": [{"type": "T4-16GB", "count": 5}]}]}
    )
    profile = analytic_profile(cluster, get_preset("llama-7b"))
    with pytest.raises(PlanError) as info:
        make_plan(profile, 8)
    message = str(info.value)
    assert message.startswith("no device can hold the model: n/0: model states 107.8 GB")
    assert "(and 2 more)" in message and "\n" not in message


def test_unknown_strategy_lists_allowed() -> None:
    allowed = r"strategy: unknown 'fastest'; allowed: .*dp, even, proportional"
    with pytest.raises(PlanError, match=allowed):
        make_plan(profile_of(device("a/0")), 4, "fastest")
    assert set(ALL_STRATEGIES) <= set(STRATEGIES)


@pytest.mark.parametrize("global_batch", [1, 2, 3, 7, 13, 101])
def test_non_divisible_batches_plan(global_batch: int) -> None:
    devices = [device(f"a/{i}", per_sample_s=0.1 + i / 10, max_micro=3) for i in range(4)]
    profile = profile_of(*devices)
    for strategy in ALL_STRATEGIES:
        assert_feasible(make_plan(profile, global_batch, strategy), profile, global_batch)


# --- communication --------------------------------------------------------------


def test_ring_allreduce_formula() -> None:
    # 2(N-1)/N · bytes · 8 / bandwidth: 4 devices, 1 GB over 100 Gbit/s = 0.06 s.
    assert ring_allreduce_s(4, 10**9, 100.0) == pytest.approx(2 * 3 / 4 * 8e9 / 100e9)
    assert ring_allreduce_s(2, 10**9, 100.0) == pytest.approx(0.08)
    assert ring_allreduce_s(1, 10**9, 100.0) == 0.0
    assert ring_allreduce_s(8, 0, 100.0) == 0.0
    links = Links(intra_node_gbps=600, inter_node_gbps=100)
    assert slowest_link_gbps(links, ["a", "a"]) == 600
    assert slowest_link_gbps(links, ["a", "b"]) == 100


def test_plan_comm_uses_slowest_link_of_active_devices() -> None:
    devices = [device("a/0"), device("a/1"), device("b/0")]
    profile = profile_of(*devices, gradient_bytes=10**8, intra_node_gbps=800, inter_node_gbps=8)
    even = plan_even(profile, 30)
    assert even.comm_s == pytest.approx(ring_allreduce_s(3, 10**8, 8))


def test_dp_trains_on_one_node_when_the_network_is_too_slow() -> None:
    # Node b (one device at 25 samples/s) outruns node a (two at 10 samples/s each).
    devices = [device("a/0"), device("a/1"), device("b/0", per_sample_s=0.04)]
    profile = profile_of(*devices, gradient_bytes=10**9, intra_node_gbps=800, inter_node_gbps=1)
    plan = make_plan(profile, 12)
    assert [(d.id, d.samples) for d in plan.active] == [("b/0", 12)]
    assert plan.comm_s == 0.0, "a single device all-reduces nothing"
    idle = [e for e in plan.excluded if e.reason.startswith("idle: training on")]
    assert idle and "alone avoids the inter-node all-reduce" in idle[0].reason
    assert plan.predicted_step_s < plan.baselines["even"].predicted_step_s
    assert_feasible(plan, profile, 12)


@st.composite
def profiles_of_few_kinds(draw: Any) -> tuple[Profile, int]:
    """Copies of one or two device kinds: the planner searches per kind, not per device."""
    global_batch = draw(st.integers(1, 14))
    kinds = [
        {
            "fixed_s": draw(st.floats(0.0, 1.0, allow_subnormal=False)),
            "per_sample_s": draw(st.floats(0.001, 1.0, allow_subnormal=False)),
            "max_micro": draw(st.integers(1, global_batch + 1)),
        }
        for _ in range(draw(st.integers(1, 2)))
    ]
    pattern = draw(st.lists(st.integers(0, len(kinds) - 1), min_size=2, max_size=5))
    devices = [device(f"n{i % 2}/{i}", **kinds[k]) for i, k in enumerate(pattern)]
    return profile_of(*devices), global_batch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiles_of_few_kinds())
def test_dp_over_repeated_kinds_equals_brute_force(case: tuple[Profile, int]) -> None:
    profile, global_batch = case
    plan = plan_dp(profile, global_batch)
    assert_feasible(plan, profile, global_batch)
    assert plan.compute_s == pytest.approx(
        brute_force_busy_s(list(profile.devices), global_batch), rel=1e-9
    )


def test_identical_devices_share_the_remainder_in_device_order() -> None:
    """Four identical devices, ten samples: the two extra samples go to the first two."""
    profile = profile_of(*(device(f"n/{i}", fixed_s=0.01) for i in range(4)))
    assert [d.samples for d in plan_dp(profile, 10).devices] == [3, 3, 2, 2]


# --- the plan document --------------------------------------------------------


def test_plan_json_round_trip() -> None:
    cluster = parse_cluster(
        {
            "name": "t",
            "nodes": [{"name": "n", "devices": [{"type": "A100-80GB"}, {"type": "L4-24GB"}]}],
        }
    )
    plan = make_plan(analytic_profile(cluster, get_preset("gpt2-small")), 33)
    data = plan.to_dict()
    assert set(data) >= {
        "strategy",
        "global_batch",
        "predicted_step_s",
        "predicted_samples_per_s",
        "compute_s",
        "comm_s",
        "devices",
        "excluded",
        "baselines",
    }
    assert set(data["devices"][0]) >= {
        "id",
        "samples",
        "micro_batch",
        "accum_steps",
        "busy_s",
        "peak_bytes",
        "layers",
    }
    assert plan_from_dict(data) == plan
    with pytest.raises(PlanError, match="plan: malformed plan document"):
        plan_from_dict({"strategy": "dp"})


def test_large_plan_json_is_exactly_the_compact_encoding_of_its_dict() -> None:
    """Beyond the pretty-printed size, plans are written entry by entry (issue 20's
    speed); the text must be what ``json.dumps`` of the document gives, for plain and
    pipeline entries alike."""
    nodes = [
        {"name": f"n{i}", "devices": [{"type": "A100-80GB"}, {"type": "T4-16GB", "count": 7}]}
        for i in range(12)
    ]
    profile = analytic_profile(parse_cluster({"name": "t", "nodes": nodes}), get_preset("gpt2-xl"))
    for strategy in ("dp", "hybrid"):
        plan = make_plan(profile, 1001, strategy)
        assert len(plan.devices) + len(plan.excluded) > 64
        assert plan.to_json() == json.dumps(plan.to_dict())
