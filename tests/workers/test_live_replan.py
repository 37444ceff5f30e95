"""Live re-planning on simulated devices: the split follows a device's speed, the loss does not.

Slow-downs are injected for real: the simulated device's pacing stretches by
the factor from the fault's step on.
"""

from __future__ import annotations

import pytest

from scheduler.faults import FaultSchedule, parse_fault
from scheduler.planner import make_plan
from tests.workers.conftest import TINY, make_cluster
from workers.session import LiveReplanning, WorkerPool, profile_cluster, train

pytestmark = pytest.mark.usefixtures("local_ray")

CLUSTER = make_cluster(["A100-80GB", "L4-24GB", "T4-16GB"])
SAME = make_cluster(["A100-80GB", "A100-80GB", "A100-80GB"], name="same")
BATCH = 24


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(CLUSTER, simulated=True)
    yield p
    p.shutdown()


def _run(cluster, pool, cache_dir, *, steps: int, faults: list[str], replan: bool = True):
    profile = profile_cluster(cluster, TINY, cache_dir=cache_dir, layers=None, pool=pool)
    plan = make_plan(profile, BATCH, "dp")
    decisions = []
    result = train(
        cluster=cluster,
        model=TINY,
        plan=plan,
        steps=steps,
        seed=3,
        cache_dir=cache_dir,
        pool=pool,
        faults=FaultSchedule([parse_fault(f) for f in faults]),
        live=LiveReplanning(profile=profile, strategy="dp", total_steps=steps) if replan else None,
        on_replan=decisions.append,
    )
    return plan, result, decisions


def test_a_3x_slowdown_moves_samples_off_the_device_once_and_training_is_unchanged(
    pool, cache_dir
) -> None:
    plan, result, decisions = _run(CLUSTER, pool, cache_dir, steps=24, faults=["a/0@10:slow=3"])
    _, plain, _ = _run(CLUSTER, pool, cache_dir, steps=24, faults=[], replan=False)
    (decision,) = decisions
    assert 10 <= decision.step <= 16, "within a few steps, never before the slow-down"
    assert decision.in_place
    before = {d.id: d.samples for d in plan.devices}
    after = {d.id: d.samples for d in decision.new_plan.devices}
    assert after["a/0"] < before["a/0"] and sum(after.values()) == BATCH
    assert result.losses == pytest.approx(plain.losses, rel=1e-4)


def test_restoring_the_speed_replans_back(pool, cache_dir) -> None:
    plan, _, decisions = _run(
        CLUSTER, pool, cache_dir, steps=44, faults=["a/0@10:slow=3", "a/0@26:restore"]
    )
    assert len(decisions) == 2
    slowed, restored = decisions
    assert slowed.step < 26 <= restored.step
    share = {d.id: d.samples for d in restored.new_plan.devices}
    assert share["a/0"] > {d.id: d.samples for d in slowed.new_plan.devices}["a/0"]


@pytest.mark.parametrize("cluster", [CLUSTER, SAME], ids=["mixed", "homogeneous"])
def test_a_steady_cluster_sees_no_replan_in_100_steps(cluster, cache_dir) -> None:
    own = WorkerPool(cluster, simulated=True)
    try:
        _, result, decisions = _run(cluster, own, cache_dir, steps=100, faults=[])
    finally:
        own.shutdown()
    assert result.steps_done == 100
    assert decisions == []
