"""Benchmark: fully-sharded data parallelism trains on devices too small for the model.

    .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_fsdp_speed.py

A simulated cluster of one A100-80GB and three A100-40GB whose memory scale leaves
the 40 GB devices too small for gpt-tiny's fp32 states: ``dp`` trains on the one
80 GB device, ``pp``/``hybrid`` (the planner's best pipeline) and ``fsdp`` on all four.
Prints, side by side from one run, each plan's predicted and measured samples/s
(error: how much faster the prediction is than the measurement); fsdp's must be
within 10 %.

Every plan is the planner's, from the measured profile; the ``fsdp`` prediction is
the sharded cost model's (:mod:`scheduler.cost.sharded`: per unit, the slowest
device's compute against its all-gathers and reduce-scatter, overlapped), which is
what the measurement checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.planning.planner import make_plan
from tests.benchmarks.conftest import big_and_small_a100s, median_step_s
from tests.support import TINY

GLOBAL_BATCH = 32
CLUSTER = big_and_small_a100s("one-big", num_80gb=1, num_40gb=3)


@pytest.mark.benchmark
def test_fsdp_against_dp_and_pipelines(paced_ray: None, tmp_path: Path) -> None:
    from workers.session import profile_cluster

    profile = profile_cluster(CLUSTER, TINY, cache_dir=tmp_path)
    plans = {
        "dp": make_plan(profile, GLOBAL_BATCH, "dp"),
        "pipeline": make_plan(profile, GLOBAL_BATCH, "hybrid"),
        "fsdp": make_plan(profile, GLOBAL_BATCH, "fsdp"),
    }
    assert len(plans["dp"].active) == 1, "the states fit only the A100-80GB"
    measured = {name: median_step_s(CLUSTER, plan, tmp_path) for name, plan in plans.items()}
    print(
        f"\n{'plan':>8}  {'strategy':>8}  devices  predicted samples/s  measured samples/s  error"
    )
    for name, plan in plans.items():
        error = measured[name] / plan.predicted_step_s - 1  # predicted over measured samples/s
        print(
            f"{name:>8}  {plan.strategy:>8}  {len(plan.active):>7}  "
            f"{GLOBAL_BATCH / plan.predicted_step_s:>19.2f}  {GLOBAL_BATCH / measured[name]:>18.2f}"
            f"  {error:+.1%}"
        )
    print(f"fsdp / dp measured throughput: {measured['dp'] / measured['fsdp']:.2f}x")
    assert measured["fsdp"] < measured["dp"]
    assert measured["fsdp"] == pytest.approx(plans["fsdp"].predicted_step_s, rel=0.10)
