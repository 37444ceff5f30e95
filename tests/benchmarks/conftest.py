"""Fixtures of the benchmarks."""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scheduler.hardware.cluster import Cluster, parse_cluster
from scheduler.planning.plan import Plan
from tests.benchmarks.simrun import CLUSTER
from tests.support import TINY
from workers.session import TrainJob, WorkerPool, start_local_ray, train

PLAN_STEPS = 6
"""Steps :func:`median_step_s` trains each plan (the first pays for warm-up)."""


def big_and_small_a100s(name: str, *, num_80gb: int, num_40gb: int) -> Cluster:
    """``num_80gb`` A100-80GB on node ``a`` and ``num_40gb`` A100-40GB on node ``b``, at a
    memory scale that leaves the 40 GB devices too small for gpt-tiny's fp32 states."""
    return parse_cluster(
        {
            "name": name,
            "nodes": [
                {"name": "a", "devices": [{"type": "A100-80GB", "count": num_80gb}]},
                {"name": "b", "devices": [{"type": "A100-40GB", "count": num_40gb}]},
            ],
            "simulation": {"memory_scale": 0.0003},
        }
    )


@contextmanager
def paced_local_ray(cluster: Cluster, margin: str = "8") -> Iterator[None]:
    """A local Ray for ``cluster`` (2 CPUs) with the pacing margin raised to ``margin``
    (``HETSCHED_PACING_MARGIN``), so four simulated devices finish their real compute
    inside their paced time on a shared machine (with the default margin, 3 for four
    actors on two otherwise idle cores, contention leaks into the timings); both undone
    afterwards."""
    import ray

    previous = os.environ.get("HETSCHED_PACING_MARGIN")
    os.environ["HETSCHED_PACING_MARGIN"] = margin
    start_local_ray(cluster, num_cpus=2)
    try:
        yield
    finally:
        ray.shutdown()
        if previous is None:
            del os.environ["HETSCHED_PACING_MARGIN"]
        else:
            os.environ["HETSCHED_PACING_MARGIN"] = previous


@pytest.fixture(scope="module")
def paced_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """:func:`paced_local_ray` for the module's ``CLUSTER``, for all of its tests."""
    with paced_local_ray(request.module.CLUSTER):
        yield


def median_step_s(cluster: Cluster, plan: Plan, cache_dir: Path) -> float:
    """``plan`` trained on gpt-tiny for :data:`PLAN_STEPS` steps: its median step time,
    the first step (warm-up) left out."""
    job = TrainJob(cluster=cluster, model=TINY, steps=PLAN_STEPS, seed=0, cache_dir=cache_dir)
    result = train(job, plan)
    return statistics.median(result.step_times_s[1:])


@pytest.fixture(scope="module")
def sim_pool() -> Iterator[WorkerPool]:
    """Warm workers of every device of the default simulation."""
    import ray

    started = start_local_ray(CLUSTER, num_cpus=2)
    pool = WorkerPool(CLUSTER, simulated=True)
    pool.warm()
    yield pool
    pool.shutdown()
    if started:
        ray.shutdown()
