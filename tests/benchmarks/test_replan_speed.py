"""Benchmark: what live re-planning buys when the fastest device slows down 3×.

The default simulation (``deploy/clusters/local-sim.yaml``, gpt-tiny, global
batch 64), 60 steps, the fastest device slowed 3× at step 10, for a
data-parallel (``dp``) and a pipeline (``pp``) plan. Three runs side by side
per strategy, on the same warm workers:

- ``keep``: the slow-down with re-planning off (the plan made for the fast device);
- ``replan``: the slow-down with live re-planning on;
- ``ideal``: the device slow from step 0 and a plan made for it (the plan the
  planner gives the slowed profile), re-planning off. Its throughput is the
  new ideal.

Printed per strategy: steps from the slow-down to the re-plan, measured
samples/s after the re-plan as a share of the ideal's (target ≥ 90 %), the
same share without re-planning, and the wall time of the 60 steps.

    pytest -m benchmark -s tests/benchmarks/test_replan_speed.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from scheduler.cost.profile import Profile
from scheduler.planning.planner import make_plan
from scheduler.replan.livecost import live_profile
from tests.benchmarks.simrun import CLUSTER, MODEL, durable_run
from workers.session import profile_cluster

BATCH, STEPS, SLOW_AT, FACTOR = 64, 60, 10, 3.0


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _fastest(profile: Profile) -> str:
    return min(profile.devices, key=lambda d: d.per_sample_s).id


def _rate(step_times: list[float]) -> float:
    return BATCH / statistics.median(step_times)


@pytest.mark.benchmark
@pytest.mark.parametrize("strategy", ["dp", "pp"])
def test_replanning_recovers_the_new_ideal_throughput(strategy, sim_pool, cache_dir) -> None:
    profile = profile_cluster(CLUSTER, MODEL, cache_dir=cache_dir, layers="auto", pool=sim_pool)
    slowed = _fastest(profile)
    fault = f"{slowed}@{SLOW_AT}:slow={FACTOR:g}"
    plan = make_plan(profile, BATCH, strategy)
    common = dict(steps=STEPS, cache_dir=cache_dir)

    keep, _, _, keep_wall = durable_run(sim_pool, profile, plan=plan, faults=[fault], **common)
    moved, decisions, _, moved_wall = durable_run(
        sim_pool, profile, plan=plan, faults=[fault], replan=True, **common
    )
    ideal, _, _, ideal_wall = durable_run(  # the slow device from the start, planned for
        sim_pool,
        profile,
        plan=make_plan(live_profile(profile, {slowed: FACTOR}), BATCH, strategy),
        faults=[f"{slowed}@0:slow={FACTOR:g}"],
        **common,
    )

    assert decisions, "the slow-down was never re-planned"
    first = decisions[0]
    after = moved.step_times_s[first.step + 2 :]  # the switch step itself pays for the move
    ideal_rate = _rate(ideal.step_times_s[1:])
    share = _rate(after) / ideal_rate
    keep_share = _rate(keep.step_times_s[SLOW_AT + 1 :]) / ideal_rate
    print(
        f"\n{strategy}: {slowed} slowed {FACTOR:g}x at step {SLOW_AT}; "
        f"re-planned at step {first.step} ({first.step - SLOW_AT} steps later, "
        f"{'in place' if first.in_place else 'through a checkpoint'}), "
        f"{len(decisions)} re-plan(s)\n"
        f"  samples/s after the slow-down: replan {_rate(after):.1f}, "
        f"keep {_rate(keep.step_times_s[SLOW_AT + 1 :]):.1f}, ideal {ideal_rate:.1f}\n"
        f"  share of the new ideal: replan {share:.1%}, keep {keep_share:.1%}\n"
        f"  wall time of {STEPS} steps: replan {moved_wall:.1f} s, keep {keep_wall:.1f} s, "
        f"ideal {ideal_wall:.1f} s"
    )
    assert moved.losses == pytest.approx(keep.losses, rel=1e-4)
    assert share >= 0.9
