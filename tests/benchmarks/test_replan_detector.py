"""Benchmark: how reliably the speed monitor reports slow-downs, and how rarely noise.

Drives :class:`~scheduler.replan.speed.SpeedMonitor` and
:func:`~scheduler.replan.decision.decide_replan`
with the simulated driver of ``tests/scheduler/test_replan.py`` (measured busy
time = prediction under the true speed × 1.08 × noise) over many seeds, and
prints the figures the module docstring of ``scheduler/replan/speed.py`` quotes:

- steady clusters, 100 steps: runs with any report (target 0);
- fastest device slowed 3× at step 10 and restored at 35: reports per run,
  steps from slow-down to report, restores reported back to exactly 1.0;
- smaller slow-downs: how many seeds report them within 50 steps;
- the predicted step after the re-plan as a share of the new ideal.

Pure Python, no Ray: ``pytest -m benchmark -s tests/benchmarks/test_replan_detector.py``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from scheduler.cost.profile import Profile
from scheduler.planning.planner import make_plan
from scheduler.replan.decision import live_profile, predict_step_s
from tests.scheduler.test_replan import (
    GLOBAL_BATCH,
    big_mixed,
    drive,
    fastest,
    homogeneous,
    local_sim,
    uniform_noise,
)

SEEDS = 200


def gaussian(sd: float) -> Callable[[random.Random], float]:
    return lambda rng: max(0.05, rng.gauss(1, sd))


NOISES = {
    "uniform ±5%": uniform_noise(0.05),
    "uniform ±15%": uniform_noise(0.15),
    "gaussian 5%": gaussian(0.05),
    "gaussian 8%": gaussian(0.08),
}


@pytest.mark.benchmark
def test_steady_clusters_never_report() -> None:
    for label, noise in NOISES.items():
        for name, cluster in (("local-sim", local_sim), ("homogeneous", homogeneous)):
            profile = cluster()
            noisy = sum(
                1
                for seed in range(SEEDS)
                if drive(profile, [], steps=100, seed=seed, noise=noise).changes
            )
            print(f"{name:12s} {label:13s} runs with a report in 100 steps: {noisy}/{SEEDS}")
            assert noisy == 0


@pytest.mark.benchmark
def test_a_3x_slowdown_and_its_restore_are_each_reported_once() -> None:
    profile = local_sim()
    slowed = fastest(profile)
    for label, noise in NOISES.items():
        reports: Counter[int] = Counter()
        delays: Counter[int] = Counter()
        restored = 0
        for seed in range(SEEDS):
            run = drive(
                profile,
                [f"{slowed}@10:slow=3", f"{slowed}@35:restore"],
                steps=70,
                seed=seed,
                noise=noise,
            )
            reports[len(run.changes)] += 1
            if run.changes:
                delays[run.changes[0].step - 10] += 1
            restored += len(run.changes) == 2 and run.changes[1].factor == 1.0
        print(
            f"{label:13s} reports per run {dict(reports)}, steps from slow-down to report "
            f"{dict(delays)}, restored to 1.0: {restored}/{SEEDS}"
        )
        assert reports[2] >= 0.99 * SEEDS


@pytest.mark.benchmark
def test_sensitivity_to_smaller_slowdowns() -> None:
    profile = local_sim()
    slowed = fastest(profile)
    for factor in (1.2, 1.3, 1.5, 2.0):
        for label in ("uniform ±5%", "uniform ±15%"):
            found = sum(
                1
                for seed in range(SEEDS // 2)
                if drive(
                    profile,
                    [f"{slowed}@10:slow={factor}"],
                    steps=60,
                    seed=seed,
                    noise=NOISES[label],
                ).changes
            )
            print(f"{factor}× slower, {label:13s}: reported in {found}/{SEEDS // 2} seeds")


@pytest.mark.benchmark
@pytest.mark.parametrize(("strategy", "cluster"), [("dp", local_sim), ("pp", big_mixed)])
def test_step_after_the_replan_against_the_new_ideal(
    strategy: str, cluster: Callable[[], Profile]
) -> None:
    profile = cluster()
    first = make_plan(profile, GLOBAL_BATCH, strategy)
    slowed = fastest(profile) if strategy == "dp" else max(first.active, key=lambda d: d.busy_s).id
    truth = live_profile(profile, {slowed: 3.0})
    ideal_s = make_plan(truth, GLOBAL_BATCH, strategy).predicted_step_s
    run = drive(profile, [f"{slowed}@10:slow=3"], steps=60, strategy=strategy, switch_cost_s=5.0)
    decision = run.decisions[0]
    after_s = predict_step_s(run.plans[-1], truth)
    stay_s = predict_step_s(first, truth)
    print(
        f"{strategy}: {slowed} 3× slower at step 10, re-planned at step {decision.step} "
        f"{'in place' if decision.in_place else 'through a checkpoint'}; predicted step "
        f"{stay_s:.4g} s without re-planning, {after_s:.4g} s after, new ideal {ideal_s:.4g} s "
        f"({ideal_s / after_s:.1%} of ideal; {ideal_s / stay_s:.1%} without re-planning)"
    )
    assert after_s < stay_s
