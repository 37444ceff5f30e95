"""Recomputation as a planner choice: per device (dp) and per stage (pp, hybrid).

What a user notices: a model that did not fit now plans; devices that have
memory to spare keep training without recomputation while tight ones trade
time for memory; the dp planner stays exactly optimal with the choice inside.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cost.profile import DeviceProfile, Profile, RecomputeCost, analytic_profile
from scheduler.errors import PlanError
from scheduler.hardware.cluster import Links, load_cluster, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.dp import optimal_split, plan_dp
from scheduler.planning.pipeline import plan_pp
from scheduler.planning.planner import make_plan
from tests.scheduler.clusters import MIXED

MB = 10**6
CLUSTERS = Path(__file__).resolve().parents[2] / "deploy" / "clusters"


def device(
    name: str,
    *,
    capacity_mb: int,
    per_sample_s: float = 0.1,
    fixed_s: float = 0.01,
    full: bool = True,
) -> DeviceProfile:
    """1000 MB of model states, 400 MB of activations per sample, 50 MB with full
    recomputation at 4/3 of the time."""
    return DeviceProfile(
        id=name,
        node=name.split("/")[0],
        type="X",
        capacity_bytes=capacity_mb * MB,
        static_bytes=1000 * MB,
        per_sample_bytes=400 * MB,
        fixed_s=fixed_s,
        per_sample_s=per_sample_s,
        full=RecomputeCost(per_sample_bytes=50 * MB, per_sample_s=per_sample_s * 4 / 3)
        if full
        else None,
    )


def profile_of(*devices: DeviceProfile) -> Profile:
    return Profile(model="m", devices=tuple(devices), links=Links())


def test_recomputation_fits_a_device_that_cannot_hold_one_sample_without_it() -> None:
    tight = device("a/0", capacity_mb=1300)  # 1000 + 400 > 1300, 1000 + 50 fits
    without = profile_of(replace(tight, full=None))
    with pytest.raises(PlanError, match=r"1\.0 GB \+ one sample 400\.0 MB exceed capacity 1\.3 GB"):
        plan_dp(without, 8)
    tighter = device("a/0", capacity_mb=1040)
    with pytest.raises(PlanError, match=r"one sample 50\.0 MB with full recomputation exceed"):
        plan_dp(profile_of(tighter), 8)
    plan = plan_dp(profile_of(tight), 8)
    (d,) = plan.devices
    # at most 6 samples of 50 MB fit beside the states: 8 = 4 + 4
    assert (d.recompute, d.samples, d.micro_batch, d.accum_steps) == ("full", 8, 4, 2)
    assert d.peak_bytes == 1000 * MB + 4 * 50 * MB <= tight.capacity_bytes


def test_a_plan_uses_recomputation_only_where_memory_needs_it() -> None:
    roomy = device("a/0", capacity_mb=1000 + 8 * 400)
    tight = device("b/0", capacity_mb=1300)
    plan = plan_dp(profile_of(roomy, tight), 12)
    by_id = {d.id: d for d in plan.devices}
    assert by_id["a/0"].recompute == "none" and by_id["a/0"].samples > 0
    assert by_id["b/0"].recompute == "full" and by_id["b/0"].samples > 0
    again = plan.to_dict()["devices"]
    assert [d["recompute"] for d in again] == ["none", "full"]
    # A runtime that does not checkpoint plans without it: the tight device sits out.
    plain = plan_dp(profile_of(roomy, tight).without_recompute(), 12)
    assert [d.id for d in plain.devices] == ["a/0"] and plain.devices[0].recompute == "none"
    assert plain.excluded[0].id == "b/0"


def test_recomputation_is_chosen_when_fewer_micro_batches_save_more_than_it_costs() -> None:
    # Without recomputation 2 samples per micro-batch: 8 micro-batches of 1 s each.
    # With it, all 16 in one micro-batch: one fixed cost, 4/3 of the per-sample time.
    slow_launch = device("a/0", capacity_mb=1000 + 2 * 400 + 1, fixed_s=1.0, per_sample_s=0.01)
    plan = plan_dp(profile_of(slow_launch), 16)
    assert plan.devices[0].recompute == "full"
    assert plan.devices[0].accum_steps == 1
    cheap_launch = replace(slow_launch, fixed_s=0.0)
    assert plan_dp(profile_of(cheap_launch), 16).devices[0].recompute == "none"


def busy_s(d: DeviceProfile, n: int) -> float:
    """DESIGN.md's busy time with the best mode that fits, re-implemented here."""
    if n == 0:
        return 0.0
    best = math.inf
    for per_sample_bytes, per_sample_s in [(d.per_sample_bytes, d.per_sample_s)] + (
        [(d.full.per_sample_bytes, d.full.per_sample_s)] if d.full else []
    ):
        m = (d.capacity_bytes - d.static_bytes) // per_sample_bytes
        if m >= 1:
            best = min(best, math.ceil(n / m) * d.fixed_s + n * per_sample_s)
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(
        st.tuples(
            st.integers(1100, 5000),  # capacity MB
            st.floats(0.01, 0.3),  # per-sample s
            st.floats(0.0, 0.5),  # fixed s
            st.booleans(),  # has full recomputation figures
        ),
        min_size=1,
        max_size=3,
    ),
    global_batch=st.integers(1, 12),
)
def test_dp_with_recomputation_is_optimal_against_brute_force(
    specs: list[tuple[int, float, float, bool]], global_batch: int
) -> None:
    devices = [
        device(f"n{i}/0", capacity_mb=c, per_sample_s=p, fixed_s=f, full=full)
        for i, (c, p, f, full) in enumerate(specs)
    ]
    devices = [d for d in devices if busy_s(d, 1) < math.inf]
    if not devices:
        return
    best = math.inf
    for split in itertools.product(range(global_batch + 1), repeat=len(devices) - 1):
        if sum(split) <= global_batch:
            counts = [*split, global_batch - sum(split)]
            best = min(best, max(busy_s(d, n) for d, n in zip(devices, counts, strict=True)))
    counts = optimal_split(devices, global_batch)
    got = max(busy_s(d, n) for d, n in zip(devices, counts, strict=True))
    assert got == pytest.approx(best, rel=1e-9)
    plan = plan_dp(profile_of(*devices), global_batch)
    for entry in plan.devices:
        d = next(x for x in devices if x.id == entry.id)
        assert entry.busy_s == pytest.approx(busy_s(d, entry.samples), rel=1e-9)
        assert entry.peak_bytes <= d.capacity_bytes


def test_recomputation_lets_llama_13b_fit_a_pipeline_where_none_did() -> None:
    profile = analytic_profile(parse_cluster(MIXED), get_preset("llama-13b"), precision="auto")
    with pytest.raises(PlanError, match="no pipeline over 6 devices fits"):
        plan_pp(profile.without_recompute(), 8)
    plan = plan_pp(profile, 8)
    modes = {d.recompute for d in plan.active}
    assert modes & {"selective", "full"}
    for d in plan.active:
        assert d.peak_bytes <= profile.device(d.id).capacity_bytes


def test_stages_choose_recomputation_only_where_memory_is_short() -> None:
    cluster = load_cluster(CLUSTERS / "university-lab.yaml")
    plan = make_plan(analytic_profile(cluster, get_preset("llama-7b")), 64, "pp")
    modes = {d.id: d.recompute for d in plan.active}
    assert "none" in modes.values() and "full" in modes.values()
    # 1F1B: the first stages hold the most micro-batches in flight, so they recompute.
    first = min(plan.active, key=lambda d: d.stage or 0)
    assert first.recompute == "full"


def test_llama_13b_plans_on_a_bundled_cluster_that_found_no_strategy() -> None:
    # Before the kernel-aware count: 163 GB of activations per sample, no strategy at all.
    model = get_preset("llama-13b")
    assert model.activation_bytes_per_sample < 40e9
    assert replace(model, attention="math").activation_bytes_per_sample > 160e9
    cluster = load_cluster(CLUSTERS / "datacenter-generations.yaml")
    plan = make_plan(analytic_profile(cluster, model, precision="auto"), 64, "auto")
    assert plan.strategy in {"pp", "hybrid"} and plan.predicted_samples_per_s > 0


def test_plan_json_round_trips_recompute_and_old_documents_mean_none() -> None:
    from scheduler.planning.plan import plan_from_dict

    plan = plan_dp(profile_of(device("a/0", capacity_mb=5000), device("b/0", capacity_mb=1300)), 8)
    document = plan.to_dict()
    assert plan_from_dict(document) == plan
    old = {
        **document,
        "devices": [{k: v for k, v in d.items() if k != "recompute"} for d in document["devices"]],
    }
    assert {d.recompute for d in plan_from_dict(old).devices} == {"none"}
    bad = {**document, "devices": [{**document["devices"][0], "recompute": "some"}]}
    with pytest.raises(PlanError, match=r"recompute 'some' is not one of none, selective, full"):
        plan_from_dict(bad)
