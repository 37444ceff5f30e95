"""Shared fixtures of the worker tests: a local Ray and a warm mixed pool, shared by
consecutive modules (:class:`tests.support.SharedRay`).

Clusters, plans and the gpt-tiny preset these tests build on are in :mod:`tests.support`.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import MIXED_CLUSTER, SHARED_RAY, make_cluster

RAY_DEVICES = make_cluster(["A100-80GB"] * 8)
"""The devices the shared Ray names: ``a/0`` to ``a/7``, what every cluster of these
modules uses (their types do not matter to Ray)."""


@pytest.fixture(scope="module")
def local_ray() -> None:
    """A local Ray (2 CPUs, no dashboard) for the module, left running for the next one."""
    SHARED_RAY.ensure(RAY_DEVICES)


@pytest.fixture(scope="module")
def mixed_pool(local_ray: None) -> Any:
    """Warm workers on :data:`tests.support.MIXED_CLUSTER` (an A100, a T4 and an L4 as
    ``a/0``, ``a/1``, ``a/2``), as the service keeps them: runs after the first start warm,
    in this module and the ones after it (a killed worker is replaced when next asked for).
    A worker knows only its device id; each run's cluster gives it its type and memory, so
    the pool serves any cluster of these modules whose devices are among ``a/0``-``a/2``."""
    from workers.session import WorkerPool

    pool = SHARED_RAY.keep(
        "mixed_pool", lambda: WorkerPool(MIXED_CLUSTER, simulated=True), lambda p: p.shutdown()
    )
    pool.mark_lost(MIXED_CLUSTER.ids, lost=False)  # what a module before took out is back
    return pool
