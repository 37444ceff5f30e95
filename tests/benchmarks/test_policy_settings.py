"""Is a trace where ``goodput`` misses the target a tuning gap, or the bound's slack?

tests/benchmarks/test_policy_robustness.py finds traces where ``goodput`` misses issue 20's
target (15 % below ``fair``'s average JCT, p99 not worse) although the shared-capacity
bound allows it. Here, on three (one at a light load, two at a heavy one), ``goodput`` is
replayed with each of its settings moved well away from its default, and once with
restarts free (the bound charges none: it shares devices between jobs in every time slot
without moving them). Printed per trace: the gain on ``fair``'s
average JCT and the p99 against ``fair``'s, for each variant. Asserted: every job
finishes and no replay beats the bound.

Run on purpose (about five minutes on a 2-core machine):

    .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_policy_settings.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.clustersim.bound import alone_avg_jct_s, shared_avg_jct_s
from scheduler.clustersim.simulator import SimSettings, simulate
from tests.benchmarks.test_policy_robustness import Case, generated, label

CASES: list[Case] = [
    ("cloud-mix", 4.0, "large", 3),
    ("sia-64", 16.0, "large", 2),
    ("gavel-48", 16.0, "small", 3),
]
"""The robustness benchmark's miss (the Gavel cluster) and the two traces that were misses
while the schedule found paid nothing for restarts; now beyond every schedule found that
pays for them (its summary lists each verdict; they move when the speed model does)."""
VARIANTS: dict[str, dict[str, float]] = {
    "default": {},
    "no fairness floor": {"fairness_floor": 0.0},
    "SRPT power 0.5": {"srpt_power": 0.5},
    "SRPT power 1": {"srpt_power": 1.0},
    "max wait 1 h": {"max_wait_s": 3600.0},
    "max wait 16 h": {"max_wait_s": 16 * 3600.0},
    "aging 4 h": {"aging_s": 4 * 3600.0},
    "no move penalty": {"move_penalty": 0.0, "move_horizon_s": 4 * 3600.0},
    "size cap 8 shares": {"size_cap_share": 8.0},
}


@pytest.mark.benchmark
@pytest.mark.parametrize("case", CASES, ids=[label(c) for c in CASES])
def test_goodput_settings_and_free_restarts_against_the_bound(case: Case) -> None:
    cluster, rates, trace = generated(case)
    base = SimSettings()
    free = SimSettings(reallocation_s=0.0, policy=replace(base.policy, reallocation_s=0.0))
    fair = simulate(cluster, trace, policy="fair", rates=rates)
    free_fair = simulate(cluster, trace, policy="fair", rates=rates, settings=free)
    runs = {
        variant: simulate(
            cluster,
            trace,
            policy="goodput",
            rates=rates,
            settings=SimSettings(policy=replace(base.policy, **changes)),
        )
        for variant, changes in VARIANTS.items()
    }
    runs["restarts free"] = simulate(cluster, trace, policy="goodput", rates=rates, settings=free)
    horizon_s = max(r.makespan_s for r in (fair, *runs.values())) + min(j.arrival_s for j in trace)
    bound_s = shared_avg_jct_s(trace, cluster, rates, horizon_s=horizon_s)
    alone_s = alone_avg_jct_s(trace, cluster, rates)
    print(
        f"\n{label(case)}: fair {fair.avg_jct_s / 3600:.3f} h "
        f"({free_fair.avg_jct_s / 3600:.3f} h with restarts free), bound "
        f"{bound_s / 3600:.3f} h ({1 - bound_s / fair.avg_jct_s:+.1%}), every job alone "
        f"{alone_s / 3600:.3f} h"
    )
    for variant, result in runs.items():
        assert len(result.jobs) == len(trace)
        assert result.avg_jct_s >= bound_s * 0.999, f"{variant} beat the bound"
        print(
            f"  goodput, {variant:18s} {result.avg_jct_s / 3600:.3f} h: gain "
            f"{1 - result.avg_jct_s / fair.avg_jct_s:+6.1%}, p99 "
            f"{result.p99_jct_s / fair.p99_jct_s - 1:+6.1%}"
        )
