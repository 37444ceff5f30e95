"""Which Ray node a spec node names: the matching rules, on plain node records (no Ray)."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from scheduler.hardware.cluster import parse_cluster, with_ray_nodes
from workers.cluster.placement import RayNode, check_placement, raylet_answers, resolve
from workers.errors import WorkerError

HEAD = RayNode(node_id="aa" * 28, address="10.0.0.5", name="10.0.0.5", resources=frozenset({"CPU"}))
B = RayNode(
    node_id="bb" * 28, address="10.0.0.6", name="10.0.0.6", resources=frozenset({"CPU", "node-b"})
)
C = RayNode(node_id="cc" * 28, address="10.0.0.6", name="10.0.0.6", resources=frozenset({"CPU"}))
SPEC = with_ray_nodes(
    parse_cluster(
        {
            "nodes": [
                {"name": "node-b", "devices": [{"type": "T4-16GB"}]},
                {"name": "head", "ray_node": "10.0.0.5", "devices": [{"type": "L4-24GB"}]},
            ]
        }
    )
)


def test_a_name_matches_by_resource_address_or_id() -> None:
    nodes = [HEAD, B, C]
    assert resolve("node-b", nodes, where="x") == B
    assert resolve("10.0.0.5", nodes, where="x") == HEAD
    assert resolve("cc" * 28, nodes, where="x") == C
    assert resolve("node-z", nodes, where="x") is None


def test_a_name_several_nodes_answer_to_is_refused() -> None:
    with pytest.raises(WorkerError, match=r"^cluster node n: '10.0.0.6' names 2 Ray nodes"):
        resolve("10.0.0.6", [HEAD, B, C], where="cluster node n")


def test_a_spec_node_without_a_live_ray_node_is_one_line_listing_the_live_ones() -> None:
    check_placement(SPEC, [HEAD, B], simulated=True)
    with pytest.raises(WorkerError) as info:
        check_placement(SPEC, [HEAD, C], simulated=True)
    message = str(info.value)
    assert message.startswith("cluster: no live Ray node for node-b; ")
    assert "live Ray nodes: 10.0.0.5 (id aaaaaaaaaaaa…); 10.0.0.6 (id cccccccccccc…)" in message
    assert "\n" not in message


def test_a_node_whose_raylet_refuses_connections_is_gone_to_a_probe() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        up = RayNode(node_id="dd" * 28, address="127.0.0.1", name="127.0.0.1", port=port)
        assert raylet_answers(up)
    assert not raylet_answers(up), "nothing listens on its port any more"
    assert raylet_answers(replace(up, port=0)), "no port known: Ray's word stands"
