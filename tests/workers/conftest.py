"""Shared fixtures of the worker tests: a module-wide local Ray and a warm mixed pool.

Clusters, plans and the gpt-tiny preset these tests build on are in :mod:`tests.support`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import make_cluster


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray per test module (2 CPUs, no dashboard), shut down after it."""
    import ray

    from workers.session import start_local_ray

    cluster = make_cluster(["A100-80GB", "T4-16GB", "L4-24GB", "V100-16GB"])
    start_local_ray(cluster, num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def mixed_pool(local_ray: None) -> Iterator[Any]:
    """Warm workers for a module's runs on an A100, a T4 and an L4 (``a/0``, ``a/1``, ``a/2``),
    as the service keeps them: runs after the first start warm."""
    from workers.session import WorkerPool

    pool = WorkerPool(make_cluster(["A100-80GB", "T4-16GB", "L4-24GB"]), simulated=True)
    yield pool
    pool.shutdown()
