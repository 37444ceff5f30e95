"""A simulated cluster spread over the nodes of a real multi-node Ray cluster.

``ray.cluster_utils.Cluster`` runs a head and two worker nodes on this machine,
each worker node started with a custom resource named after a spec node
(``ray start --resources='{"node-a": 1}'`` on a real cluster), so the spec's
devices run on the Ray nodes they name (``workers.cluster.placement``). Checkpoints
go to one directory every node reads and writes (on one machine it stands for
a shared volume). Then a Ray node is removed mid-job: its device is lost, the
job re-plans on the rest and ends as an uninterrupted run would.

The cluster lives in its own Ray directory (``RAY_TMPDIR``): ``Cluster`` writes
its address where a plain ``ray.init()`` of another process would find it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import psutil
import pytest
import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster as RayCluster

from scheduler.cost.profile import analytic_profile
from scheduler.hardware.cluster import parse_cluster, with_ray_nodes
from scheduler.planning.plan import Plan
from scheduler.planning.planner import make_plan
from tests.support import TINY, manual_plan, tiny_job
from workers.cluster.placement import check_placement, live_nodes
from workers.session import (
    Checkpointing,
    CheckpointStore,
    Recorder,
    RunConfig,
    WorkerPool,
    train,
)

pytestmark = pytest.mark.slow

CLUSTER = with_ray_nodes(
    parse_cluster(
        {
            "name": "two-ray-nodes",
            "nodes": [
                {"name": "node-a", "devices": [{"type": "A100-80GB"}, {"type": "L4-24GB"}]},
                {"name": "node-b", "devices": [{"type": "T4-16GB"}]},
            ],
            "simulation": {"memory_scale": 0.01},
        }
    )
)
SEED, STEPS = 4, 8
DP = manual_plan([("node-a/0", 6, 6), ("node-b/0", 2, 2), ("node-a/1", 4, 2)])
LOSE_AT_STEP = 4
"""node-b goes after step 4; the checkpoint of step 3 is the one to resume from."""


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[tuple[RayCluster, dict[str, object]]]:
    root = tempfile.mkdtemp(prefix="hmn", dir="/tmp")  # short: Ray's socket paths
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ["RAY_TMPDIR"] = root
    os.environ.pop("RAY_ADDRESS", None)
    cluster = RayCluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        nodes = {n: cluster.add_node(num_cpus=1, resources={n: 1}) for n in ("node-a", "node-b")}
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pool(ray_nodes) -> Iterator[WorkerPool]:
    p = WorkerPool(CLUSTER, simulated=True)
    yield p
    p.shutdown()


def _replan(lost: set[str]) -> Plan:
    """What the service does: plan the same global batch on the devices left."""
    left = [d for d in CLUSTER.ids if d not in lost]
    profile = analytic_profile(CLUSTER.subset(left), TINY, simulated=True)
    return make_plan(profile, DP.global_batch, "dp")


def _raylet_pid(node) -> int:
    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def test_devices_run_on_the_ray_nodes_their_spec_names(ray_nodes, pool) -> None:
    check_placement(CLUSTER, live_nodes(), simulated=True)
    pool.warm()
    raylets = {_raylet_pid(node): name for name, node in ray_nodes[1].items()}
    where = {}
    for device_id, pid in pool.pids().items():  # a worker process is its raylet's child
        parents = {p.pid for p in psutil.Process(pid).parents()}
        where[device_id] = [name for raylet, name in raylets.items() if raylet in parents]
    assert where == {"node-a/0": ["node-a"], "node-a/1": ["node-a"], "node-b/0": ["node-b"]}


def test_a_ray_node_removed_mid_job_is_planned_around_and_training_is_unchanged(
    ray_nodes, pool, cache_dir, tmp_path
) -> None:
    cluster, nodes = ray_nodes
    job = tiny_job(CLUSTER, cache_dir, steps=STEPS, seed=SEED)
    reference = train(job, DP, pool=pool).losses
    shared = tmp_path / "shared-volume"

    def remove_node_b(metrics) -> None:
        if metrics.step == LOSE_AT_STEP and not hooks.recoveries and "node-b/0" not in pool.lost():
            # No waiting for Ray to mark it dead: the recovery must find it gone itself
            # (Ray's view, or its raylet refusing connections: placement.live_nodes).
            cluster.remove_node(nodes["node-b"])

    hooks = Recorder(watch=remove_node_b)
    result = train(
        job,
        DP,
        pool=pool,
        config=RunConfig(
            checkpointing=Checkpointing(root=str(shared), every_steps=2, keep_last=2),
            max_failures=1,
        ),
        hooks=hooks,
        replan=_replan,
    )
    (recovery,) = hooks.recoveries
    assert recovery.lost == ("node-b/0",) and "node-b/0" in recovery.error
    assert (recovery.resumed_step, recovery.failed_step) == (LOSE_AT_STEP, LOSE_AT_STEP + 1)
    assert sorted(d["id"] for d in recovery.new_plan["devices"]) == ["node-a/0", "node-a/1"]
    assert result.steps_done == STEPS and not result.stopped
    assert result.losses == pytest.approx(reference, rel=1e-4)
    assert pool.lost() == {"node-b/0"}, "the removed node's device stays lost"
    latest = CheckpointStore(str(shared)).latest()
    assert latest is not None and latest.step == STEPS - 1
    assert {d["id"] for d in latest.manifest["plan"]["devices"]} == {"node-a/0", "node-a/1"}
