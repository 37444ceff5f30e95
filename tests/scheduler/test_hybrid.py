"""Hybrid plans: valid pipelines side by side, uneven shares, the whole batch once."""

from __future__ import annotations

import random

import pytest

from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning import hybrid
from scheduler.planning.bounds import step_lower_bounds
from scheduler.planning.hybrid import allocate
from scheduler.planning.pipeline import layer_usable, micro_batch_candidates
from scheduler.planning.planner import make_plan
from scheduler.planning.stages import Chain, Stage, tied_embedding
from tests.support import unit_device


def _cluster(num_nodes: int, per_node: int = 4) -> dict:
    types = ["A100-80GB", "V100-16GB", "L4-24GB", "T4-16GB"]
    return {
        "name": "lab",
        "nodes": [
            {"name": f"n{i}", "devices": [{"type": types[i % len(types)], "count": per_node}]}
            for i in range(num_nodes)
        ],
    }


def _check_valid(plan, profile, global_batch: int, num_blocks: int) -> None:
    pipelines: dict[int, list] = {}
    for d in plan.devices:
        pipelines.setdefault(d.pipeline, []).append(d)
        assert d.peak_bytes <= profile.device(d.id).capacity_bytes
    assert sum(ds[0].samples for ds in pipelines.values()) == global_batch
    offsets = sorted((ds[0].offset, ds[0].samples) for ds in pipelines.values())
    position = 0
    for offset, samples in offsets:  # each sample of the batch in exactly one pipeline
        assert offset == position
        position += samples
    for ds in pipelines.values():
        ds.sort(key=lambda d: d.stage)
        assert [d.stage for d in ds] == list(range(len(ds)))
        assert ds[0].layers[0] == 0 and ds[-1].layers[1] == num_blocks
        for a, b in zip(ds, ds[1:], strict=False):
            assert a.layers[1] == b.layers[0]
        assert len({(d.samples, d.offset, d.accum_steps) for d in ds}) == 1


def test_hybrid_is_valid_and_uses_devices_dp_cannot():
    profile = analytic_profile(parse_cluster(_cluster(4)), get_preset("gpt2-xl"))
    plan = make_plan(profile, 128, "hybrid")
    _check_valid(plan, profile, 128, 48)
    dp = make_plan(profile, 128, "dp")
    assert len(plan.active) > len(dp.active)
    assert plan.predicted_step_s < dp.predicted_step_s
    assert len({d.pipeline for d in plan.active}) >= 2


def test_hybrid_shares_are_uneven_when_pipelines_differ():
    profile = analytic_profile(parse_cluster(_cluster(4)), get_preset("gpt2-large"))
    plan = make_plan(profile, 256, "hybrid")
    _check_valid(plan, profile, 256, 36)
    shares = {d.pipeline: d.samples for d in plan.devices}
    assert len(set(shares.values())) > 1


def _chain(total_s: float, slowest_s: float) -> Chain:
    lone = unit_device("x/0")
    stages = (
        Stage(device=lone, first=0, last=1, time_s=slowest_s, peak_bytes=0),
        Stage(device=lone, first=1, last=1, time_s=total_s - slowest_s, peak_bytes=0),
    )
    return Chain(stages=stages, micro_batch=1)


def test_allocate_minimises_the_slowest_pipeline():
    chains = [_chain(3.0, 2.0), _chain(1.0, 0.5)]
    counts = allocate(chains, [0.0, 0.0], 10)
    assert sum(counts) == 10
    best = min(max(chains[0].compute_s(k), chains[1].compute_s(10 - k)) for k in range(11))
    assert max(c.compute_s(n) for c, n in zip(chains, counts, strict=True)) == best


def test_512_device_hybrid_plan_is_valid_and_beats_dp():
    """How fast it plans is measured in tests/benchmarks/test_hybrid_speed.py."""
    profile = analytic_profile(parse_cluster(_cluster(64, 8)), get_preset("gpt2-xl"))
    plan = make_plan(profile, 2048, "hybrid")
    _check_valid(plan, profile, 2048, 48)
    assert plan.predicted_step_s < make_plan(profile, 2048, "dp").predicted_step_s


@pytest.mark.parametrize("global_batch", [1, 7, 97])
def test_batches_that_do_not_divide(global_batch: int):
    profile = analytic_profile(parse_cluster(_cluster(2)), get_preset("gpt2-medium"))
    plan = make_plan(profile, global_batch, "hybrid")
    _check_valid(plan, profile, global_batch, 24)


def _mixed(num_nodes: int, seed: int) -> dict:
    """Nodes of four random catalogue GPUs: pipelines of unlike stages."""
    rng = random.Random(seed)
    types = ["A100-80GB", "V100-16GB", "L4-24GB", "T4-16GB", "A10-24GB", "RTX3090-24GB"]
    return {
        "name": "mix",
        "nodes": [
            {"name": f"n{i}", "devices": [{"type": rng.choice(types)} for _ in range(4)]}
            for i in range(num_nodes)
        ],
    }


@pytest.mark.parametrize(
    ("seed", "model", "global_batch"),
    [(1, "gpt2-xl", 96), (2, "gpt2-medium", 37), (3, "gpt2-small", 130)],
)
def test_step_bound_never_exceeds_the_step_and_pruning_keeps_the_plan(
    seed: int, model: str, global_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound that prunes micro-batch sizes (scheduler.planning.bounds) is below the
    step each size really gets, and the plan is the one the unpruned search finds."""
    profile = analytic_profile(parse_cluster(_mixed(4, seed)), get_preset(model))
    partitioner = hybrid.Partitioner(tied_embedding(profile))
    usable = layer_usable(profile)
    for groups in (
        hybrid.group_by_node(usable, partitioner),
        hybrid.group_by_type(usable, partitioner, 1),
    ):
        sizes = micro_batch_candidates(global_batch)
        bounds = step_lower_bounds(groups, global_batch, sizes, profile.links)
        for size, bound in zip(sizes, bounds, strict=True):
            monkeypatch.setattr(hybrid, "micro_batch_candidates", lambda _b, s=size: [s])
            choice = hybrid.evaluate("t", groups, global_batch, profile, partitioner)
            if choice is not None:
                assert bound <= choice.step_s, (size, bound, choice.step_s)
        monkeypatch.undo()
    pruned = make_plan(profile, global_batch, "hybrid")
    monkeypatch.setattr(hybrid, "step_lower_bounds", lambda _g, _b, sizes, _l: [0.0] * len(sizes))
    assert make_plan(profile, global_batch, "hybrid") == pruned
