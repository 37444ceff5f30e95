"""Every cluster spec shipped in deploy/clusters loads and plans GPT-2 small."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import load_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.planner import make_plan

CLUSTERS = Path(__file__).resolve().parents[2] / "deploy" / "clusters"
SPECS = sorted(CLUSTERS.glob("*.yaml"))


def test_the_examples_are_there() -> None:
    names = {p.name for p in SPECS}
    assert {"local-sim.yaml", "mixed-lab.yaml"} <= names
    assert len(names) >= 4


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_example_plans_gpt2_small(path: Path) -> None:
    cluster = load_cluster(path)
    assert len({d.type for d in cluster.devices}) >= 2, "examples are mixed clusters"
    profile = analytic_profile(cluster, get_preset("gpt2-small"))
    global_batch = 16 * len(cluster.devices) + 3  # deliberately not divisible
    plan = make_plan(profile, global_batch, "dp")
    assert sum(d.samples for d in plan.devices) == global_batch
    for entry in plan.devices:
        assert entry.peak_bytes <= profile.device(entry.id).capacity_bytes
    for baseline in plan.baselines.values():
        assert plan.predicted_samples_per_s >= baseline.predicted_samples_per_s


def test_cephalos_four_gpu_mix_plans_uneven_splits_by_speed() -> None:
    """Cephalo's evaluation cluster: two L4, an RTX A6000 and a Tesla P40 (issue 20)."""
    cluster = load_cluster(CLUSTERS / "cephalo-mix.yaml")
    assert sorted(d.type for d in cluster.devices) == [
        "A6000-48GB",
        "L4-24GB",
        "L4-24GB",
        "P40-24GB",
    ]
    # in mixed precision where the card has it, as Cephalo trains (the P40 runs fp32)
    profile = analytic_profile(cluster, get_preset("gpt2-small"), precision="auto")
    plan = make_plan(profile, 67, "dp")
    samples = {profile.device(d.id).type: d.samples for d in plan.devices}
    # the A6000 is the fastest by far, and the P40 (fp32 only) the slowest
    assert samples["A6000-48GB"] > samples["L4-24GB"] > samples["P40-24GB"]
    assert plan.predicted_samples_per_s > 1.3 * plan.baselines["even"].predicted_samples_per_s
