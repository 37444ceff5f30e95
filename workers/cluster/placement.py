"""Which Ray node runs a device: a cluster spec's ``ray_node`` names matched to live nodes.

A simulated spec names each node's Ray node (``scheduler/hardware/cluster.py``); a
real GPU is named by its node's IP address (:func:`workers.session.connect_ray`).
:func:`resolve` says how a name matches.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.hardware.cluster import Cluster, Device
from workers.errors import WorkerError

PROBE_TIMEOUT_S = 2.0
"""How long a raylet may take to accept a connection before its node counts as gone."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RayNode:
    node_id: str
    address: str
    name: str
    resources: frozenset[str] = field(default_factory=frozenset)
    """Names of the node's resources, custom ones included."""
    port: int = 0
    """Its raylet's port (0: unknown)."""

    def answers_to(self, selector: str) -> bool:
        return selector in (self.node_id, self.address, self.name) or selector in self.resources

    def describe(self) -> str:
        custom = sorted(r for r in self.resources if not _builtin(r))
        extra = f" resources {', '.join(custom)}" if custom else ""
        return f"{self.address} (id {self.node_id[:12]}…{extra})"


def _builtin(resource: str) -> bool:
    return resource in ("CPU", "GPU", "memory", "object_store_memory") or resource.startswith(
        ("node:", "accelerator_type:")
    )


def live_nodes(*, probe: bool = False) -> list[RayNode]:
    """The alive nodes of the connected Ray cluster.

    Ray marks a node dead only after several missed health checks (seconds to
    tens of seconds); with ``probe`` a node whose raylet refuses a connection
    now counts as gone already, so a recovery right after a node dies plans
    without it instead of failing on it a second time.
    """
    import ray

    nodes = [_from_ray(info) for info in ray.nodes() if info.get("Alive")]
    return [n for n in nodes if raylet_answers(n)] if probe else nodes


def raylet_answers(node: RayNode, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the node's raylet accepts a TCP connection within ``timeout_s`` (a dead
    process refuses at once; a powered-off or cut-off machine times out)."""
    if not node.port or not node.address:
        return True  # nothing to probe: Ray's word stands
    try:
        with socket.create_connection((node.address, node.port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _from_ray(info: dict[str, Any]) -> RayNode:
    return RayNode(
        node_id=str(info["NodeID"]),
        address=str(info.get("NodeManagerAddress", "")),
        name=str(info.get("NodeName", "")),
        resources=frozenset(info.get("Resources", {})),
        port=int(info.get("NodeManagerPort") or 0),
    )


def nodes_from_gcs(address: str) -> list[RayNode]:
    """The alive nodes as the GCS at ``address`` lists them, without joining as a driver
    (``hetsched serve`` checks a spec before it starts; call after
    :func:`workers.cluster.ray_connect.check_auth`)."""
    from ray._raylet import GcsClient

    alive = 0  # GcsNodeInfo.GcsNodeState.ALIVE
    info = GcsClient(address=address).get_all_node_info(timeout=10)
    return [
        RayNode(
            node_id=node_id.hex(),
            address=n.node_manager_address,
            name=n.node_name,
            resources=frozenset(n.resources_total),
        )
        for node_id, n in info.items()
        if n.state == alive
    ]


def selector_of(device: Device, *, simulated: bool) -> str | None:
    """The name that places ``device``: its spec's ``ray_node``, a real GPU's node address,
    or None for a simulated device of the embedded local Ray (placed by resource)."""
    if device.ray_node is not None:
        return device.ray_node
    return None if simulated else device.node


def resolve(selector: str, nodes: Sequence[RayNode], *, where: str) -> RayNode | None:
    """The one node ``selector`` names, None when none is alive; several is an error.

    A name must match exactly one live Ray node; the match is made again at
    every actor start, so a node that left and came back (a new node id, the
    same resource) takes its devices again. A device whose name matches no live
    node is *lost* (:meth:`workers.cluster.pool.WorkerPool.lost`) until one appears.

    Example: Ray nodes ``{id: "ab12…", address: "10.0.0.5", resources: {"node-b": 1}}``
    and ``{id: "cd34…", address: "10.0.0.6"}``; ``node-b``, ``10.0.0.5`` and ``ab12…``
    all name the first; ``CPU`` names both, which is refused as ambiguous.
    """
    found = [n for n in nodes if n.answers_to(selector)]
    if len(found) > 1:
        listed = "; ".join(n.describe() for n in found)
        raise WorkerError(
            f"{where}: {selector!r} names {len(found)} Ray nodes ({listed}); name one by its "
            "node id, or give the custom resource to one node only"
        )
    return found[0] if found else None


def check_placement(cluster: Cluster, nodes: Iterable[RayNode], *, simulated: bool) -> None:
    """Every node of ``cluster`` names exactly one live Ray node, or one line saying which not."""
    nodes = list(nodes)
    missing: list[str] = []
    for node in cluster.nodes:
        device = next(d for d in cluster.devices if d.node == node)
        selector = selector_of(device, simulated=simulated)
        if selector is None:
            continue
        if resolve(selector, nodes, where=f"cluster node {node}") is None:
            missing.append(f"{node} (ray_node {selector!r})" if selector != node else node)
    if missing:
        live = "; ".join(n.describe() for n in nodes) or "none"
        raise WorkerError(
            f"cluster: no live Ray node for {', '.join(missing)}; a spec node names its Ray "
            "node by ray_node (node id, IP address, node name or custom resource, default "
            f"its own name); live Ray nodes: {live}"
        )
