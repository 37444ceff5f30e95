"""Shared fixtures of the worker tests: small clusters and a module-wide local Ray."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray

from scheduler.hardware.cluster import Cluster, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.plan import DevicePlan, Plan

TINY = get_preset("gpt-tiny")


def make_cluster(types: list[str], *, memory_scale: float = 0.01, name: str = "t") -> Cluster:
    return parse_cluster(
        {
            "name": name,
            "nodes": [{"name": "a", "devices": [{"type": t} for t in types]}],
            "simulation": {"memory_scale": memory_scale},
        }
    )


def manual_plan(split: list[tuple[str, int, int]], *, strategy: str = "dp") -> Plan:
    """A plan from ``(device id, samples, micro_batch)`` triples, in batch order."""
    devices, offset = [], 0
    for device_id, samples, micro in split:
        accum = -(-samples // micro) if samples else 0
        devices.append(
            DevicePlan(
                id=device_id,
                samples=samples,
                micro_batch=micro,
                accum_steps=accum,
                busy_s=0.0,
                peak_bytes=0,
                offset=offset,
            )
        )
        offset += samples
    return Plan(
        strategy=strategy,
        global_batch=offset,
        predicted_step_s=0.5,
        compute_s=0.5,
        comm_s=0.0,
        devices=tuple(devices),
    )


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray per test module (2 CPUs, no dashboard), shut down after it."""
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
