"""Ray plumbing shared by the pool, the profiler and the driver: placement, gathering, failure.

Placement follows DESIGN.md, "Implementation notes" (:func:`actor_options`);
:func:`gather` waits with a deadline, so a run never hangs, and names the device
that failed first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster, Device
from workers.errors import DeviceOutOfMemory, RecurringFailure, WorkerError

RESOURCE_PREFIX = "hetsched:"
_INIT_LOCK = threading.Lock()
ERROR_GRACE_S = 3.0
"""After a first failure, how long to wait for the others to report theirs."""


def device_resource(device_id: str) -> str:
    return f"{RESOURCE_PREFIX}{device_id}"


def start_local_ray(cluster: Cluster, *, num_cpus: int = 2) -> bool:
    """``ray.init()`` a local Ray whose custom resources name every simulated device.

    Returns True when this call started Ray, False when this process already
    had Ray initialised (its actors then use the resources it has, or this
    node); only the caller that started it should stop it.
    """
    with _INIT_LOCK:
        if ray.is_initialized():
            return False
        _init_local(cluster, num_cpus=num_cpus)
        return True


def _init_local(cluster: Cluster, *, num_cpus: int) -> None:
    """Start Ray with the fewest processes its ``ray.init`` allows.

    Ray 2.x always starts, besides the raylet and the GCS, an autoscaler
    monitor, a log monitor, an API server and each node's dashboard and
    runtime-env agents; ``include_dashboard=False`` only leaves out the web
    UI (the API server then runs with ``--disable-frontend``). Those
    processes are this Ray's and end with it (api/core/local_ray.py stops them).
    ``worker_niceness`` 0: Ray starts its workers at nice 15 by default, and the
    simulated devices then get a tiny share of the cores beside any other
    CPU-bound process, keeping no pace at all on a host in use.
    ``address="local"``: without it ``ray.init`` joins any Ray that ``ray start``
    left running on this machine (it looks for their GCS processes), and a
    simulation would run on someone else's cluster, or fail to start.
    """
    resources = {device_resource(d.id): 1000.0 for d in cluster.devices}
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources=resources,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        configure_logging=True,
        _system_config={"worker_niceness": 0},
    )


def actor_options(device: Device, *, simulated: bool, name: str | None = None) -> dict[str, Any]:
    """Ray options that place one actor on ``device``.

    Every actor asks for ``num_cpus=0`` (so more simulated devices than cores can be
    placed) and lands on its device. On one machine each simulated device is a custom
    Ray resource, ``hetsched:NODE/INDEX``, created by :func:`start_local_ray`; when a
    local Ray was started without them (another cluster spec in the same process) the
    actor is pinned to this node instead. On a real cluster an actor asks for one GPU on
    the node that holds its device.
    """
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_concurrency": 1}
    if name is not None:
        options["name"] = name
    if simulated:
        resource = device_resource(device.id)
        if resource in ray.cluster_resources():
            options["resources"] = {resource: 1.0}
        else:
            node_id = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        return options
    options["num_gpus"] = 1
    options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
        node_id_of(device.node), soft=False
    )
    return options


def node_id_of(node: str) -> str:
    """The Ray node id of a node named by :func:`workers.session.connect_ray` (its IP)."""
    for info in ray.nodes():
        if info.get("Alive") and node in (info.get("NodeManagerAddress"), info.get("NodeName")):
            return str(info["NodeID"])
    raise WorkerError(f"{node}: no live Ray node with this address")


def _rank_of_error(exc: BaseException) -> int:
    """Lower is more likely the root cause of a joint failure."""
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, DeviceOutOfMemory):
        return 0
    if isinstance(exc, RayActorError):
        return 1
    text = str(exc).lower()
    if any(w in text for w in ("gloo", "nccl", "connection", "timed out", "broken pipe")):
        return 3
    return 2


def recurs(exc: BaseException) -> bool:
    """The worker's own code rejected its work (out of memory for the plan, a dataset,
    checkpoint or plan it cannot use): a retry would meet the same error."""
    rejected = DeviceOutOfMemory | HetschedError
    return isinstance(exc, RayTaskError) and isinstance(exc.cause, rejected)


def describe(device_id: str, exc: BaseException) -> str:
    """One line naming the device for a Ray failure."""
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, DeviceOutOfMemory):
        return str(exc.cause)
    if isinstance(exc, RayActorError):
        return (
            f"{device_id}: worker process died (actor lost: killed, crashed or out of host memory)"
        )
    if isinstance(exc, RayTaskError):
        cause = exc.cause if exc.cause is not None else exc
        lines = [line for line in str(cause).strip().splitlines() if line.strip()]
        last = lines[-1] if lines else type(cause).__name__
        return f"{device_id}: worker failed: {type(cause).__name__}: {last[:300]}"
    return f"{device_id}: worker failed: {type(exc).__name__}: {exc}"


def gather(
    refs: Sequence[ray.ObjectRef], device_ids: Sequence[str], *, timeout_s: float, what: str
) -> list[Any]:
    """Results of ``refs`` in order, or :class:`WorkerError` naming the failing device
    (a :class:`RecurringFailure` when the root cause would recur).

    Waits with :func:`ray.wait` and a deadline, so a run never hangs. The first error
    names its device; when several actors fail together (one dies, its peers then lose
    the collective) the root cause is preferred: out of memory, then a dead actor, then
    any other error, and communication errors of the peers last.
    """
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    deadline = time.monotonic() + timeout_s
    errors: list[tuple[int, str, bool]] = []
    grace_end = float("inf")
    while pending:
        left = deadline - time.monotonic()
        if errors:
            left = min(left, grace_end - time.monotonic())
        if left <= 0:
            break
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            i = index[ref]
            try:
                results[i] = ray.get(ref, timeout=10)
            except (RayTaskError, RayActorError, GetTimeoutError) as exc:
                grace_end = min(grace_end, time.monotonic() + ERROR_GRACE_S)
                errors.append((_rank_of_error(exc), describe(device_ids[i], exc), recurs(exc)))
    if errors:
        _, message, recurring = min(errors)
        raise RecurringFailure(message) if recurring else WorkerError(message)
    if pending:
        slow = ", ".join(device_ids[index[r]] for r in pending)
        raise WorkerError(f"{slow}: no answer to {what} within {timeout_s:.0f} s")
    return results
