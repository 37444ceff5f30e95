"""The fully-sharded planner (``fsdp``): optimal against exhaustive search, within memory,
shards that follow memory, and the strategy ``auto`` picks when no device holds the model.

The step and memory models are written out again here, independently of
:mod:`scheduler.planning.fsdp`, from its module docstring: the brute force prices every
plan with them, so a planner that drifted from its documented model would fail."""

from __future__ import annotations

import functools
import math
import random
from dataclasses import replace
from itertools import product
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cost.costs import LayerCost, LayerProfile, RecomputeCost, ShardingFigures
from scheduler.cost.profile import DeviceProfile, Profile, analytic_profile, profile_from_dict
from scheduler.errors import PlanError, ProfileError
from scheduler.hardware.cluster import Links, load_cluster, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.plan import Plan, plan_from_dict, shard_bounds
from scheduler.planning.planner import make_plan
from scheduler.replan.decision import decide_replan, switches_in_place
from scheduler.replan.livecost import live_profile, missing_devices, predict_step_s
from tests.support import REPO

MIXED_LAB = REPO / "deploy" / "clusters" / "mixed-lab.yaml"
SF = ShardingFigures(num_blocks=2, block_numel=1000, embed_numel=600, head_numel=200)
"""A small model: two blocks of 1,000 elements, 16 kB of states each."""
LINKS = Links(intra_node_gbps=0.001, inter_node_gbps=0.0005)
"""Slow enough (125 kB/s) that collectives matter next to compute."""


# --- the model of the module docstring, written out again -----------------------------


def comm_s(sf: ShardingFigures, ranks: int, theta: float, gbps: float) -> tuple[list[float], float]:
    """Per unit kind: 2 gathers + 1 reduce-scatter over the ring, each with its latency;
    and the first gather."""
    numel = [sf.embed_numel, sf.block_numel, sf.gathered_head_numel]
    rate = gbps * 1e9 / 8
    latency = sf.collective_latency_s if ranks > 1 else 0.0
    moved = 2 * sf.gather_bytes_per_element + sf.grad_bytes_per_element
    per = [(ranks - 1) * theta * e * moved / rate + 3 * latency for e in numel]
    first = (ranks - 1) * theta * numel[0] * sf.gather_bytes_per_element / rate + latency
    return per, first


def held_bytes(sf: ShardingFigures, ranks: int, theta: float) -> float:
    """Two gathered copies and a gradient of the largest module; gloo stages ``ranks + 1``
    padded slices of it (two elements of rounding) while the prefetch is in flight."""
    largest = max(sf.embed_numel, sf.block_numel, sf.gathered_head_numel)
    held = largest * (2 * sf.gather_bytes_per_element + sf.grad_bytes_per_element)
    if sf.padded_collectives and ranks > 1:
        held += (ranks + 1) * (math.ceil(theta * largest) + 2) * sf.gather_bytes_per_element
    return held


def option(d: DeviceProfile, mode: str) -> Any:
    return next((o for o in d.options() if o.recompute == mode), None)


def unit_s(d: DeviceProfile, mode: str, m: int) -> list[float]:
    assert d.layers is not None
    lp = d.layers
    block = next(o for o in lp.block.options() if o.recompute == mode)
    return [
        lp.embed.fixed_s + m * lp.embed.per_sample_s,
        block.fixed_s + m * block.per_sample_s,
        lp.head.fixed_s + m * lp.head.per_sample_s,
    ]


def step_s(
    devices: list[DeviceProfile], sf: ShardingFigures, gbps: float, k: int, micro, modes, theta
) -> float:
    comm, first = comm_s(sf, len(devices), theta, gbps)
    counts = [1, sf.num_blocks, 1]
    slowest = [0.0, 0.0, 0.0]
    for d, m, mode in zip(devices, micro, modes, strict=True):
        if m:
            slowest = [max(a, b) for a, b in zip(slowest, unit_s(d, mode, m), strict=True)]
    return k * (first + sum(n * max(c, t) for n, c, t in zip(counts, slowest, comm, strict=True)))


def least_theta(devices, sf: ShardingFigures, micro, modes) -> float | None:
    """The most even shards that fit beside these micro-batches: least largest shard."""
    n, states = len(devices), sf.shardable_state_bytes

    def fits(theta: float) -> bool:
        total = 0.0
        for d, m, mode in zip(devices, micro, modes, strict=True):
            act = option(d, mode).per_sample_bytes * m if m else 0
            room = d.capacity_bytes - sf.unsharded_bytes - held_bytes(sf, n, theta) - act
            if room < 0:
                return False
            total += min(theta, room / states)
        return total >= 1 - 1e-12

    # padded gathers grow with the largest shard: the feasible set is an interval, scan for it
    points = 40 if sf.padded_collectives else 1
    grid = [1 / n + (1 - 1 / n) * i / points for i in range(points + 1)]
    first = next((i for i, t in enumerate(grid) if fits(t)), None)
    if first is None:
        return None
    lo, hi = (grid[first - 1], grid[first]) if first else (grid[0], grid[0])
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def brute_force_s(
    devices: list[DeviceProfile], sf: ShardingFigures, gbps: float, batch: int
) -> float:
    """The least step over every k, micro-batch per device, mode per device, with the least
    communicating shards for each."""
    best = math.inf
    modes_of = [[o.recompute for o in d.options()] for d in devices]
    for per_micro in sorted({-(-batch // k) for k in range(1, batch + 1)}):
        k = -(-batch // per_micro)  # a larger k with the same ⌈B/k⌉ only adds collectives
        for micro in product(range(per_micro + 1), repeat=len(devices)):
            if sum(micro) < per_micro:
                continue
            for modes in product(*modes_of):
                theta = least_theta(devices, sf, micro, modes)
                if theta is not None:
                    best = min(best, step_s(devices, sf, gbps, k, micro, modes, theta))
    return best


# --- small profiles ---------------------------------------------------------------------


def device(
    i: int,
    *,
    capacity: int,
    slow: float,
    act: int,
    fixed: float = 0.02,
    recompute: bool = False,
    ends_slow: float | None = None,
) -> DeviceProfile:
    """A device ``slow`` times slower than the reference in its blocks (``ends_slow`` in
    its embedding and head, by default the same), ``act`` activation bytes a sample."""
    ends = slow if ends_slow is None else ends_slow
    piece = LayerCost(
        fixed_s=fixed * ends, per_sample_s=0.05 * ends, static_bytes=0, per_sample_bytes=0
    )
    block = LayerCost(
        fixed_s=fixed * slow,
        per_sample_s=0.3 * slow,
        static_bytes=16 * SF.block_numel,
        per_sample_bytes=act // 2,
        full=RecomputeCost(per_sample_bytes=act // 8, per_sample_s=0.4 * slow)
        if recompute
        else None,
    )
    layers = LayerProfile(
        num_blocks=2, embed=piece, block=block, head=piece, boundary_bytes_per_sample=0
    )
    return DeviceProfile(
        id=f"a/{i}",
        node="a",
        type="T",
        capacity_bytes=capacity,
        static_bytes=SF.shardable_state_bytes,
        per_sample_bytes=act,
        # the whole model's figures are its layers' sums (fsdp scales the layers to them)
        fixed_s=2 * fixed * (ends + slow),
        per_sample_s=0.1 * ends + 0.6 * slow,
        layers=layers,
        full=RecomputeCost(per_sample_bytes=act // 4, per_sample_s=0.1 * ends + 0.8 * slow)
        if recompute
        else None,
    )


def small_profile(devices: list[DeviceProfile], sf: ShardingFigures = SF) -> Profile:
    return Profile(model="toy", devices=tuple(devices), links=LINKS, sharding=sf)


def random_case(rng: random.Random, *, same_shape: bool = True) -> tuple[Profile, int]:
    """1 to 3 devices, memory for a few samples, half with full recomputation figures; with
    ``same_shape`` every device's pieces keep one proportion (only their speed differs)."""
    n = rng.choice([1, 2, 2, 3])
    recompute = n <= 2 and rng.random() < 0.5
    devices = []
    for i in range(n):
        act = rng.choice([2_000, 5_000, 9_000])
        capacity = held_bytes(SF, n, 1.0) + rng.randint(1, 4) * act + rng.randint(20_000, 60_000)
        slow = rng.choice([1.0, 1.5, 3.0])
        devices.append(
            device(
                i,
                capacity=int(capacity),
                slow=slow,
                act=act,
                recompute=recompute,
                ends_slow=slow if same_shape else rng.choice([0.5, 1.0, 4.0]),
            )
        )
    return small_profile(devices, replace(SF, padded_collectives=rng.random() < 0.5)), rng.randint(
        1, 6
    )


def planned_and_best(rng: random.Random, *, same_shape: bool) -> tuple[float, float] | None:
    """The planner's step and the exhaustive optimum of one random case (None: no plan)."""
    profile, batch = random_case(rng, same_shape=same_shape)
    assert profile.sharding is not None
    best = brute_force_s(list(profile.devices), profile.sharding, LINKS.intra_node_gbps, batch)
    try:
        plan = make_plan(profile, batch, "fsdp")
    except PlanError:
        assert math.isinf(best), "the planner found nothing where a plan exists"
        return None
    assert_valid(plan, profile, batch)
    assert predict_step_s(plan, profile) == pytest.approx(plan.predicted_step_s, rel=1e-9)
    assert plan.predicted_step_s >= best * (1 - 1e-9), "better than exhaustive: models differ"
    return plan.predicted_step_s, best


def test_plan_equals_brute_force_on_small_clusters() -> None:
    """Exhaustive search over k, micro-batches, modes and the least-communicating shards;
    where every device's pieces keep one proportion the planner finds its optimum."""
    rng = random.Random(17)
    results = [r for _ in range(20) if (r := planned_and_best(rng, same_shape=True))]
    assert len(results) >= 12
    for planned, best in results:
        assert planned == pytest.approx(best, rel=1e-6)


def test_plan_is_near_brute_force_when_pieces_differ_in_shape() -> None:
    """Embedding and head up to 8x apart in speed relative to the blocks: the search's
    bottleneck (the slowest device over all pieces) is then a bound, not the optimum;
    the module docstring states the bound (3x) and the measured gap (10 %), checked here."""
    rng = random.Random(5)
    results = [r for _ in range(12) if (r := planned_and_best(rng, same_shape=False))]
    assert len(results) >= 8
    assert max(planned / best for planned, best in results) <= 1.10


# --- what a plan must hold --------------------------------------------------------------


def assert_valid(plan: Plan, profile: Profile, batch: int) -> None:
    assert plan.strategy == "fsdp"
    assert sum(d.samples for d in plan.devices) == batch
    groups: dict[Any, list] = {}
    for d in plan.devices:
        groups.setdefault(d.shard_group, []).append(d)
    for members in groups.values():
        assert sum(d.shard for d in members) == pytest.approx(1.0, abs=1e-9)
        assert len({d.accum_steps for d in members}) == 1, "one accumulation per group"
    sf = profile.sharding
    assert sf is not None
    for members in groups.values():
        theta = max(d.shard for d in members)
        for d in members:
            dev = profile.device(d.id)
            assert d.samples <= d.accum_steps * d.micro_batch
            act = option(dev, d.recompute).per_sample_bytes * d.micro_batch if d.micro_batch else 0
            need = d.shard * sf.shardable_state_bytes + sf.unsharded_bytes + act
            need += held_bytes(sf, len(members), theta)
            assert need <= dev.capacity_bytes + 1, f"{d.id} needs {need} of {dev.capacity_bytes}"
            assert d.peak_bytes <= dev.capacity_bytes + 1


@functools.cache
def tiny_profile(types: tuple[str, ...]) -> Profile:
    cluster = parse_cluster(
        {
            "name": "e",
            "nodes": [{"name": "a", "devices": [{"type": t} for t in types]}],
            "simulation": {"memory_scale": 1.0},
        }
    )
    return analytic_profile(cluster, get_preset("gpt-tiny"), simulated=True)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    types=st.lists(
        st.sampled_from(["A100-80GB", "L4-24GB", "T4-16GB", "V100-32GB"]), min_size=1, max_size=5
    ),
    edge=st.floats(min_value=-0.02, max_value=0.4),
    batch=st.integers(min_value=1, max_value=48),
)
def test_memory_never_exceeds_capacity_near_the_edge(
    types: list[str], edge: float, batch: int
) -> None:
    """Capacities scaled to just above what the states need in all: every plan made fits
    every device (shard, gathered units, micro-batch activations), or planning says why."""
    base = tiny_profile(tuple(types))
    sf = base.sharding
    assert sf is not None
    n = len(types)
    # the least any plan needs in all: the states, and on each device its gathered units
    # and one sample's activations
    least = sf.shardable_state_bytes + sum(
        held_bytes(sf, n, 1 / n) + min(o.per_sample_bytes for o in d.options())
        for d in base.devices
    )
    scale = (1 + edge) * least / sum(d.capacity_bytes for d in base.devices)
    devices = tuple(replace(d, capacity_bytes=int(d.capacity_bytes * scale)) for d in base.devices)
    profile = replace(base, devices=devices)
    try:
        plan = make_plan(profile, batch, "fsdp")
    except PlanError as exc:
        assert "fsdp" in str(exc) and "\n" not in str(exc)
        return
    assert_valid(plan, profile, batch)


def test_shards_follow_memory_when_it_is_tight() -> None:
    """Two equally fast devices, one with twice the free memory: it holds about twice the
    states when the states need most of the memory there is."""
    act = 2_000
    overhead = held_bytes(SF, 2, 1.0) + act
    states = SF.shardable_state_bytes
    small = int(overhead + states / 3 * 1.02)
    large = int(overhead + 2 * states / 3 * 1.02)
    profile = small_profile(
        [device(0, capacity=large, slow=1.0, act=act), device(1, capacity=small, slow=1.0, act=act)]
    )
    plan = make_plan(profile, 2, "fsdp")
    big, little = plan.devices
    assert big.shard / little.shard == pytest.approx(2.0, rel=0.1)
    assert_valid(plan, profile, 2)


def test_shards_are_even_when_memory_allows() -> None:
    """With room to spare, uneven shards would only lengthen every collective."""
    act = 2_000
    roomy = int(held_bytes(SF, 2, 1.0) + SF.shardable_state_bytes + 10 * act)
    profile = small_profile(
        [
            device(0, capacity=2 * roomy, slow=1.0, act=act),
            device(1, capacity=roomy, slow=1.0, act=act),
        ]
    )
    plan = make_plan(profile, 4, "fsdp")
    assert [d.shard for d in plan.devices] == pytest.approx([0.5, 0.5])


def test_batches_follow_speed() -> None:
    act = 2_000
    roomy = int(held_bytes(SF, 2, 1.0) + SF.shardable_state_bytes + 20 * act)
    profile = small_profile(
        [
            device(0, capacity=roomy, slow=1.0, act=act, fixed=0.0),
            device(1, capacity=roomy, slow=3.0, act=act, fixed=0.0),
        ]
    )
    plan = make_plan(profile, 16, "fsdp")
    fast, slow = plan.devices
    assert fast.samples == pytest.approx(3 * slow.samples, abs=3)


def test_device_without_room_for_gathered_units_is_excluded_with_numbers() -> None:
    act = 2_000
    roomy = int(held_bytes(SF, 2, 1.0) + SF.shardable_state_bytes + 10 * act)
    tiny = int(held_bytes(SF, 2, 0.5))
    profile = small_profile(
        [device(0, capacity=roomy, slow=1.0, act=act), device(1, capacity=tiny, slow=1.0, act=act)]
    )
    plan = make_plan(profile, 4, "fsdp")
    assert [d.id for d in plan.devices] == ["a/0"]
    (excluded,) = plan.excluded
    assert excluded.id == "a/1" and "gathered" in excluded.reason and "capacity" in excluded.reason


def test_shard_bounds_of_a_plan_tile_every_unit() -> None:
    profile = analytic_profile(load_cluster(MIXED_LAB), get_preset("llama-7b"))
    plan = make_plan(profile, 32, "fsdp")
    fractions = [d.shard for d in plan.devices]
    for numel in (profile.sharding.block_numel, profile.sharding.embed_numel):
        bounds = shard_bounds(numel, fractions)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert plan_from_dict(plan.to_dict()).devices == plan.devices


# --- big models on real clusters --------------------------------------------------------


def test_llama_13b_on_mixed_lab_does_not_fit_in_fp32_states_and_says_by_how_much() -> None:
    """208 GB of fp32 states against 189 GB of memory in all: no strategy fits, and the
    fsdp message gives both figures."""
    profile = analytic_profile(load_cluster(MIXED_LAB), get_preset("llama-13b"))
    with pytest.raises(PlanError) as info:
        make_plan(profile, 64, "fsdp")
    assert "208.3 GB" in str(info.value) and "left in all" in str(info.value)


def test_auto_names_each_strategy_once_when_none_fits() -> None:
    with pytest.raises(PlanError) as info:
        make_plan(analytic_profile(load_cluster(MIXED_LAB), get_preset("llama-13b")), 64, "auto")
    message = str(info.value)
    assert message.startswith("no strategy fits (dp: ")
    assert "fsdp: model states 208.3 GB" in message and "fsdp: fsdp" not in message


def two_a100s_four_l4s() -> Profile:
    cluster = parse_cluster(
        {
            "name": "lab",
            "nodes": [
                {
                    "name": "a",
                    "devices": [{"type": "A100-80GB", "count": 2}, {"type": "L4-24GB", "count": 4}],
                }
            ],
        }
    )
    return analytic_profile(cluster, get_preset("llama-13b"), precision="auto")


def test_llama_13b_shards_follow_memory_over_big_and_small_gpus() -> None:
    """No device holds llama-13b's states; the A100s (80 GB) hold more than twice the
    L4s' (24 GB) share, and every device stays within its memory."""
    profile = two_a100s_four_l4s()
    plan = make_plan(profile, 64, "fsdp")
    assert_valid(plan, profile, 64)
    a100 = [d for d in plan.devices if d.id in {"a/0", "a/1"}]
    l4 = [d for d in plan.devices if d.id not in {"a/0", "a/1"}]
    assert min(d.shard for d in a100) > 2 * max(d.shard for d in l4)


def test_each_shard_trains_in_the_precision_its_costs_were_priced_in() -> None:
    """The plan entry's precision is what the worker's autocast runs; the costs are the
    profile's, in that device's precision (bf16 on both here), so they must agree."""
    profile = two_a100s_four_l4s()
    plan = make_plan(profile, 64, "fsdp")
    assert {d.id: d.precision for d in plan.devices} == {d.id: d.precision for d in profile.devices}
    assert {d.precision for d in plan.devices} == {"bf16"}


@pytest.mark.parametrize(
    ("model", "gpu", "count"), [("llama-7b", "L4-24GB", 8), ("llama-13b", "L4-24GB", 16)]
)
def test_auto_picks_fsdp_where_no_device_holds_the_model(model: str, gpu: str, count: int) -> None:
    """dp cannot run, fsdp is predicted faster than the pipelines, and the notes say both."""
    cluster = parse_cluster(
        {"name": "x", "nodes": [{"name": "a", "devices": [{"type": gpu, "count": count}]}]}
    )
    profile = analytic_profile(cluster, get_preset(model))
    plan = make_plan(profile, 64, "auto")
    assert plan.strategy == "fsdp"
    assert_valid(plan, profile, 64)
    notes = " ".join(plan.notes)
    assert "fsdp wins" in notes and "dp cannot run" in notes and "dp infeasible" in notes
    assert plan.baselines["pp"].predicted_step_s > 1.05 * plan.predicted_step_s


def test_hsdp_is_chosen_when_nodes_are_alike_and_the_link_between_them_slow() -> None:
    cluster = parse_cluster(
        {
            "name": "two",
            "nodes": [
                {"name": n, "devices": [{"type": "A100-80GB", "count": 4}]} for n in ("x", "y")
            ],
            "links": {"intra_node_gbps": 600, "inter_node_gbps": 10},
        }
    )
    profile = analytic_profile(cluster, get_preset("llama-13b"), precision="auto")
    plan = make_plan(profile, 64, "fsdp")
    assert {d.shard_group for d in plan.devices} == {0, 1}
    assert_valid(plan, profile, 64)
    assert "HSDP" in plan.notes[0] and "one group of 8" in plan.notes[1]
    assert predict_step_s(plan, profile) == pytest.approx(plan.predicted_step_s, rel=1e-9)


# --- profiles and re-planning -----------------------------------------------------------


def test_profile_document_carries_sharding_figures() -> None:
    profile = two_a100s_four_l4s()
    doc = profile.to_dict()
    assert doc["sharding"]["block_numel"] == get_preset("llama-13b").block_params
    assert profile_from_dict(doc).sharding == profile.sharding
    doc["sharding"]["block_numel"] = -1
    with pytest.raises(ProfileError, match="sharding.block_numel"):
        profile_from_dict(doc)
    del doc["sharding"]
    derived = profile_from_dict(doc).sharding
    assert derived is not None and derived.block_numel == profile.sharding.block_numel
    assert derived.padded_collectives, "a profile that does not say is priced as gloo"


def test_replan_of_fsdp_goes_through_a_checkpoint_and_counts_shard_holders() -> None:
    profile = two_a100s_four_l4s()
    plan = make_plan(profile, 64, "fsdp")
    assert not switches_in_place(plan, plan)
    slowed = live_profile(profile, {"a/0": 3.0})
    decision = decide_replan(
        plan, slowed, global_batch=64, strategy="fsdp", steps_left=1000, switch_cost_s=10.0
    )
    assert decision.switch and not decision.in_place
    assert decision.old_step_s > plan.predicted_step_s
    idle = next(d.id for d in plan.devices if d.samples == 0)
    gone = profile.subset([d.id for d in profile.devices if d.id != idle])
    assert missing_devices(plan, gone) == [idle], "a device with no samples still owns a shard"
