"""Cluster specs: what a user's YAML becomes, and what every mistake in it says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cost.profile import analytic_profile
from scheduler.errors import SpecError
from scheduler.hardware.catalogue import GIB
from scheduler.hardware.cluster import cluster_to_dict, load_cluster, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.planner import make_plan
from tests.support import spec_error

DESIGN_EXAMPLE = """
name: mixed-lab
nodes:
  - name: node-a
    devices:
      - type: A100-80GB
        count: 2
  - name: node-b
    devices:
      - type: T4-16GB
        count: 2
        memory_gb: 15
links:
  intra_node_gbps: 600
  inter_node_gbps: 100
simulation:
  memory_scale: 0.001
"""


def spec(**overrides: Any) -> dict[str, Any]:
    """A valid two-node spec, with top-level keys replaced by ``overrides``."""
    data: dict[str, Any] = {
        "name": "t",
        "nodes": [
            {"name": "a", "devices": [{"type": "A100-80GB", "count": 2}]},
            {"name": "b", "devices": [{"type": "T4-16GB"}]},
        ],
    }
    data.update(overrides)
    return data


def test_design_example_parses_into_devices_named_node_slash_index() -> None:
    cluster = parse_cluster(yaml.safe_load(DESIGN_EXAMPLE))
    assert cluster.name == "mixed-lab"
    assert cluster.ids == ["node-a/0", "node-a/1", "node-b/0", "node-b/1"]
    assert cluster.nodes == ["node-a", "node-b"]
    t4 = cluster.device("node-b/1")
    assert (t4.node, t4.index, t4.type) == ("node-b", 1, "T4-16GB")
    assert t4.memory_gb == 15, "memory_gb overrides the catalogue's 16"
    assert t4.memory_bytes == 15 * GIB
    assert cluster.device("node-a/0").memory_gb == 80
    assert cluster.links.inter_node_gbps == 100
    assert cluster.simulation.memory_scale == 0.001


def test_indices_count_across_a_nodes_device_entries() -> None:
    data = spec(
        nodes=[{"name": "n", "devices": [{"type": "L4-24GB", "count": 2}, {"type": "T4-16GB"}]}]
    )
    cluster = parse_cluster(data)
    assert [(d.id, d.type) for d in cluster.devices] == [
        ("n/0", "L4-24GB"),
        ("n/1", "L4-24GB"),
        ("n/2", "T4-16GB"),
    ]


@pytest.mark.parametrize("written", ["a100-80gb", "A100-80gb", " a100-80GB "])
def test_gpu_types_match_case_insensitively_and_become_canonical(written: str) -> None:
    cluster = parse_cluster(spec(nodes=[{"name": "n", "devices": [{"type": written}]}]))
    assert cluster.devices[0].type == "A100-80GB"


def test_defaults_when_optional_sections_are_absent() -> None:
    cluster = parse_cluster(spec())
    assert cluster.links.intra_node_gbps > cluster.links.inter_node_gbps > 0
    assert cluster.simulation.memory_scale > 0
    assert len(cluster.devices) == 3, "count defaults to 1"


def test_unknown_type_lists_the_known_ones() -> None:
    data = spec(nodes=[{"name": "n", "devices": [{"type": "GTX1080-8GB"}]}])
    message = spec_error(data)
    assert message.startswith("nodes[0].devices[0].type: unknown GPU type 'GTX1080-8GB'")
    for key in ("H100-80GB", "A100-40GB", "T4-16GB", "RTX4090-24GB"):
        assert key in message


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("T4 32GB", "no entry of it has 32 GB; the catalogue has T4-16GB (16 GB) ("),
        ("H100 94GB", "the catalogue has H100-80GB (80 GB); did you mean H100NVL-94GB?"),
    ],
)
def test_a_memory_no_entry_of_the_gpu_has_is_refused_not_rounded(written: str, said: str) -> None:
    message = spec_error(spec(nodes=[{"name": "n", "devices": [{"type": written}]}]))
    assert (
        message.startswith(f"nodes[0].devices[0].type: GPU type {written!r}: ") and said in message
    )
    assert "memory_gb" in message
    # The entry named with its own memory, or written as its driver names it, still resolves.
    for name, key in (("T4 16GB", "T4-16GB"), ("H100 NVL 94GB", "H100NVL-94GB")):
        ok = spec(nodes=[{"name": "n", "devices": [{"type": name}]}])
        assert parse_cluster(ok).devices[0].type == key


@pytest.mark.parametrize(
    ("written", "entry", "per_board"),
    [("MI250X-128GB", "MI250X-64GB", 2), ("K80 24GB", "K80-12GB", 2), ("A16 64GB", "A16-16GB", 4)],
)
def test_a_whole_boards_memory_says_the_catalogue_counts_its_devices(
    written: str, entry: str, per_board: int
) -> None:
    # An MI250X module is sold as 128 GB, but ROCm, PyTorch and Ray see two 64 GB GCDs: a
    # spec that lists modules would plan half the ranks with twice the memory each.
    message = spec_error(spec(nodes=[{"name": "n", "devices": [{"type": written}]}]))
    assert message.startswith(f"nodes[0].devices[0].type: GPU type {written!r}: ")
    assert f"board of {per_board}" in message and f"as {entry}" in message
    assert f"{per_board}x the count" in message
    assert "\n" not in message


def test_missing_type_names_the_field() -> None:
    message = spec_error(spec(nodes=[{"name": "n", "devices": [{"count": 2}]}]))
    assert message.startswith("nodes[0].devices[0].type: required")


def test_duplicate_node_names() -> None:
    nodes = [{"name": "a", "devices": [{"type": "L4-24GB"}]}] * 2
    message = spec_error(spec(nodes=nodes))
    assert message.startswith("nodes[1].name: duplicate node name 'a'")


@pytest.mark.parametrize("count", [0, -1, 1.5, "two", True, None])
def test_count_must_be_an_integer_of_at_least_one(count: Any) -> None:
    message = spec_error(
        spec(nodes=[{"name": "n", "devices": [{"type": "L4-24GB", "count": count}]}])
    )
    assert message.startswith("nodes[0].devices[0].count: must be an integer >= 1")
    assert repr(count) in message


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (spec(gpus=3), "gpus"),
        (
            spec(nodes=[{"name": "n", "gpus": [], "devices": [{"type": "L4-24GB"}]}]),
            "nodes[0].gpus",
        ),
        (
            spec(nodes=[{"name": "n", "devices": [{"type": "L4-24GB", "mem": 3}]}]),
            "nodes[0].devices[0].mem",
        ),
        (spec(links={"inter_gbps": 3}), "links.inter_gbps"),
        (spec(simulation={"scale": 3}), "simulation.scale"),
    ],
)
def test_unknown_keys_are_named_with_the_allowed_ones(data: Any, field: str) -> None:
    message = spec_error(data)
    assert message.startswith(f"{field}: unknown key; allowed: ")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (["a", "b"], "cluster: must be a mapping"),
        (None, "cluster: must be a mapping, got nothing (an empty file or key)"),
        (spec(nodes="node-a"), "nodes: must be a non-empty list"),
        (spec(nodes=[]), "nodes: must be a non-empty list"),
        (spec(nodes=["node-a"]), "nodes[0]: must be a mapping"),
        (
            spec(nodes=[{"name": "n", "devices": ["T4-16GB"]}]),
            "nodes[0].devices[0]: must be a mapping",
        ),
        (spec(nodes=[{"name": "n", "devices": []}]), "nodes[0].devices: must be a non-empty list"),
        (spec(nodes=[{"name": "n"}]), "nodes[0].devices: must be a non-empty list"),
        (spec(links=[600, 100]), "links: must be a mapping"),
        (spec(name=""), "name: must be a non-empty string"),
    ],
)
def test_wrong_shapes_name_the_field(data: Any, field: str) -> None:
    assert spec_error(data).startswith(field)


@pytest.mark.parametrize("name", ["", "a/b", 7, None])
def test_node_names_must_be_plain_strings(name: Any) -> None:
    message = spec_error(spec(nodes=[{"name": name, "devices": [{"type": "L4-24GB"}]}]))
    assert message.startswith("nodes[0].name:")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (
            spec(nodes=[{"name": "n", "devices": [{"type": "T4-16GB", "memory_gb": 0}]}]),
            "nodes[0].devices[0].memory_gb",
        ),
        (
            spec(nodes=[{"name": "n", "devices": [{"type": "T4-16GB", "memory_gb": "lots"}]}]),
            "nodes[0].devices[0].memory_gb",
        ),
        (spec(links={"inter_node_gbps": -5}), "links.inter_node_gbps"),
        (spec(links={"intra_node_gbps": "fast"}), "links.intra_node_gbps"),
        (spec(simulation={"memory_scale": 0}), "simulation.memory_scale"),
    ],
)
def test_bad_numbers_name_the_field_and_the_value(data: Any, field: str) -> None:
    message = spec_error(data)
    assert message.startswith(f"{field}: must be a number >=")
    assert "got" in message


def test_load_cluster_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(DESIGN_EXAMPLE)
    assert len(load_cluster(path).devices) == 4


def test_bad_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nnodes:\n  - name: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken\.yaml is not valid YAML at line \d+"):
        load_cluster(path)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"cluster: cannot read .*missing\.yaml"):
        load_cluster(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="cannot read"):
        load_cluster(tmp_path)  # a directory


def test_empty_file_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(SpecError, match="cluster: must be a mapping"):
        load_cluster(path)


def test_cluster_to_dict_round_trips() -> None:
    cluster = parse_cluster(yaml.safe_load(DESIGN_EXAMPLE))
    again = parse_cluster(yaml.safe_load(yaml.safe_dump(cluster_to_dict(cluster))))
    assert again == cluster


def test_subset_and_unknown_device_id() -> None:
    cluster = parse_cluster(yaml.safe_load(DESIGN_EXAMPLE))
    assert cluster.subset(["node-b/1", "node-a/0"]).ids == ["node-a/0", "node-b/1"]
    with pytest.raises(SpecError, match=r"device: unknown id 'node-c/0'; known: node-a/0"):
        cluster.subset(["node-c/0"])


def test_simulation_lists_faults_among_its_keys() -> None:
    message = spec_error(spec(simulation={"fault": []}))
    assert message == "simulation.fault: unknown key; allowed: faults, memory_scale"
    assert parse_cluster(spec(simulation={"faults": None})).simulation.faults == ()


def test_a_node_may_name_the_ray_node_its_devices_run_on() -> None:
    from scheduler.hardware.cluster import with_ray_nodes

    data = spec()
    data["nodes"][0]["ray_node"] = "10.0.0.7"
    cluster = parse_cluster(data)
    assert {d.node: d.ray_node for d in cluster.devices} == {"a": "10.0.0.7", "b": None}
    placed = with_ray_nodes(cluster)
    assert {d.node: d.ray_node for d in placed.devices} == {"a": "10.0.0.7", "b": "b"}
    again = parse_cluster(yaml.safe_load(yaml.safe_dump(cluster_to_dict(placed))))
    assert again == placed
    data["nodes"][0]["ray_node"] = ""
    assert spec_error(data).startswith("nodes[0].ray_node: must be a Ray node id, IP address")


@pytest.mark.parametrize(
    ("written", "memory_gb", "key"),
    [
        ("A100 80GB", None, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),  # as nvidia-smi prints it
        ("A100", 80, "A100-80GB"),  # the memory the entry gives picks the size
        ("RTX 4090", None, "RTX4090-24GB"),
        ("RTX A6000", None, "A6000-48GB"),
        ("T4", None, "T4-16GB"),
        ("tesla v100-pcie-16gb", None, "V100PCIE-16GB"),
    ],
)
def test_a_gpu_is_named_as_people_and_drivers_write_it(
    written: str, memory_gb: float | None, key: str
) -> None:
    entry: dict[str, Any] = {"type": written, "count": 2}
    if memory_gb is not None:
        entry["memory_gb"] = memory_gb
    cluster = parse_cluster({"name": "t", "nodes": [{"name": "n", "devices": [entry]}]})
    assert {d.type for d in cluster.devices} == {key}


def test_a_model_sold_with_several_memories_needs_one_named() -> None:
    data = spec(nodes=[{"name": "n", "devices": [{"type": "A100", "count": 2}]}])
    assert spec_error(data) == (
        "nodes[0].devices[0].type: GPU type 'A100' is sold with several memories: "
        "name one of A100-80GB, A100-40GB"
    )


def two_boxes(**b_links: float) -> dict[str, Any]:
    """An NVLink box of four A100s and a PCIe box of four, the second with ``b_links``."""
    b: dict[str, Any] = {"name": "pcie", "devices": [{"type": "A100-80GB", "count": 4}]}
    if b_links:
        b["links"] = b_links
    return spec(
        nodes=[
            {
                "name": "nvlink",
                "devices": [{"type": "A100-80GB", "count": 4}],
                "links": {"intra_node_gbps": 2400},
            },
            b,
        ],
        links={"intra_node_gbps": 256, "inter_node_gbps": 100},
    )


def test_a_node_may_have_its_own_links_and_a_ring_runs_at_its_slowest_hop() -> None:
    cluster = parse_cluster(two_boxes(inter_node_gbps=10))
    links = cluster.links
    assert links.between(["nvlink"]) == 2400  # its own NVLink
    assert links.between(["pcie"]) == 256  # the cluster's figure
    assert links.between(["nvlink", "pcie"]) == 10  # the slow card of the PCIe box
    again = parse_cluster(yaml.safe_load(yaml.safe_dump(cluster_to_dict(cluster))))
    assert again.links == links


def test_plans_see_a_nodes_own_links() -> None:
    def dp_comm_s(data: dict[str, Any], node: str | None = None) -> float:
        cluster = parse_cluster(data)
        if node is not None:
            cluster = cluster.subset([d.id for d in cluster.devices if d.node == node])
        # a batch big enough that both boxes are worth their all-reduce even at 10 Gbit/s
        plan = make_plan(analytic_profile(cluster, get_preset("gpt2-small")), 256, "dp")
        return plan.comm_s

    # Across both boxes the gradients cross the PCIe box's 10 Gbit/s card, not the 100.
    assert dp_comm_s(two_boxes(inter_node_gbps=10)) > 5 * dp_comm_s(two_boxes())
    # Inside the NVLink box they move at its 2400, not the cluster's 256.
    assert dp_comm_s(two_boxes(), "nvlink") < dp_comm_s(two_boxes(), "pcie") / 5


@pytest.mark.parametrize(
    ("links", "message"),
    [
        (
            {"inter_node_gbps": 0},
            "nodes[1].links.inter_node_gbps: must be a number >= 0.001, got 0",
        ),
        ({"nvlink": True}, "nodes[1].links.nvlink"),
        ({}, "nodes[1].links: give intra_node_gbps, inter_node_gbps or both"),
    ],
)
def test_a_bad_node_link_names_the_node_and_the_field(links: Any, message: str) -> None:
    data = two_boxes()
    data["nodes"][1]["links"] = links
    assert spec_error(data).startswith(message)
