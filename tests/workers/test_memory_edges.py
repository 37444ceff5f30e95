"""Plans never run out of memory, at the edge of capacity or at real GPU sizes.

In-process: the worker class is driven directly (a world of one gloo rank),
so each case measures a device, plans on the measurement and trains on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.cost.profile import profile_from_dict
from scheduler.planning.plan import DevicePlan
from scheduler.planning.planner import make_plan
from tests.support import TINY
from workers.devices.calibration import HostCalibration
from workers.devices.pacing import Pacing
from workers.records import OptimizerConfig
from workers.runtime.distributed import leave_group
from workers.runtime.measure import HOST_CHECK_BYTES
from workers.runtime.spec import RankSpec, RunSpec
from workers.runtime.worker import DeviceWorker

FAST = Pacing(margin=1.0, speed_ratio=1.0, host=HostCalibration(fixed_s=0.0, per_sample_s=1e-6))


@pytest.fixture
def worker() -> Iterator[DeviceWorker]:
    w = DeviceWorker("edge/0", simulated=True)
    yield w
    w.leave()
    leave_group()


def _plan_and_train(worker: DeviceWorker, capacity: int, global_batch: int) -> DevicePlan:
    """Measure at ``capacity``, plan dp, train two steps; the device's plan."""
    measured = worker.measure(TINY, capacity, FAST, None)
    figures = dict(measured["figures"])
    limit = figures.pop("max_micro_batch")
    profile = profile_from_dict(
        {
            "model": TINY.name,
            "devices": [
                {"id": "edge/0", "node": "edge", "type": "T4-16GB", **figures}
                | ({"micro_batch_limit": limit} if limit else {})
            ],
            "gradient_bytes": 4,
        }
    )
    plan = make_plan(profile, global_batch, "dp")
    (d,) = plan.active
    run = RunSpec(
        preset=TINY,
        seed=0,
        global_batch=global_batch,
        optimizer=OptimizerConfig(),
        dataset=None,
        simulated=True,
    )
    rank = RankSpec(
        device_id="edge/0",
        rank=0,
        world_size=1,
        offset=0,
        samples=d.samples,
        micro_batch=d.micro_batch,
        accum_steps=d.accum_steps,
        capacity_bytes=capacity,
        pacing=FAST,
        recompute=d.recompute,
    )
    addr, port = worker.rendezvous()
    worker.join(run, rank, addr, port)
    for step in range(2):
        out = worker.step(step)  # raises DeviceOutOfMemory if the plan was wrong
        assert out.device.peak_bytes <= capacity
    worker.leave()
    return d


@pytest.fixture(scope="module")
def roomy() -> dict:
    """The profile's figures of a device with room to spare."""
    return DeviceWorker("roomy/0", simulated=True).measure(TINY, 2**40, FAST, None)["figures"]


@pytest.mark.parametrize(("room", "slack"), [(1, 0.0), (2, 0.99), (3, 0.0), (4, 0.5), (5, 0.0)])
def test_no_plan_runs_out_of_memory_at_the_edge_of_capacity(worker, roomy, room, slack) -> None:
    """Capacities that leave room for exactly 1–5 samples by the profile's memory model
    (plus a share of one more): the plan's micro-batch always runs."""
    per_sample = roomy["per_sample_bytes"]
    capacity = roomy["static_bytes"] + room * per_sample + int(slack * per_sample)
    d = _plan_and_train(worker, capacity, global_batch=7)
    assert d.micro_batch >= 1
    if d.recompute == "none":  # recomputation may fit more: its own figures were measured
        assert d.micro_batch <= room


def test_a_simulated_gpu_at_real_memory_size_plans_without_host_memory_for_it(worker) -> None:
    """memory_scale 1.0: an 80 GB device. The fit check stays within the host bound, and
    the plan (whose micro-batch the global batch bounds) trains."""
    capacity = 80 * 2**30
    measured = worker.measure(TINY, capacity, FAST, None)["figures"]
    per_sample = measured["per_sample_bytes"]
    assert measured["max_micro_batch"] == (capacity - measured["static_bytes"]) // per_sample
    assert measured["max_micro_batch"] > HOST_CHECK_BYTES // per_sample  # not all run on the host
    d = _plan_and_train(worker, capacity, global_batch=16)
    assert d.micro_batch == 16 and d.recompute == "none"
