"""Fixtures of the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.benchmarks.simrun import CLUSTER
from workers.session import WorkerPool, start_local_ray


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
