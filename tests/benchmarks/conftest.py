"""Fixtures of the benchmarks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from scheduler.hardware.cluster import Cluster, parse_cluster
from tests.benchmarks.simrun import CLUSTER
from workers.session import WorkerPool, start_local_ray


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
