"""Reading specs fast changes nothing a user sees: the same documents, devices and errors."""

from __future__ import annotations

import gc
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.errors import SpecError
from scheduler.hardware.catalogue import known_types
from scheduler.hardware.cluster import load_cluster, parse_cluster
from scheduler.hardware.fast_yaml import cyclic_gc_paused, load_yaml
from tests.support import spec_error

ROOT = Path(__file__).resolve().parents[2]

DOCUMENTS = {
    "plain spec": "name: lab\nnodes:\n- name: a\n  devices:\n  - {type: T4-16GB, count: 2}\n",
    "scalars": "a: 1\nb: 1.5\nc: true\nd: null\ne: ~\nf: '7'\ng: 0x1f\nh: .inf\ni: 2024-05-01\n",
    "anchors and aliases": "x: &eight [{type: L4-24GB, count: 8}]\ny: *eight\nz: *eight\n",
    "merge keys": "base: &b {type: A100-80GB, count: 2}\nnode: {<<: *b, memory_gb: 70}\n",
    "non-string keys": "1: one\ntrue: yes\nnull: nothing\n2.5: x\n",
    "explicit tags": "a: !!str 5\nb: !!float '1'\nc: !!set {x, y}\nd: !!omap [{k: v}]\n",
    "value key": "a: {=: 3}\n",
    "duplicate keys": "a: 1\na: 2\n",
    "nested flow": "nodes: [{name: a, devices: [{type: T4-16GB}, {type: L4-24GB}]}]\n",
    "empty mapping and list": "a: {}\nb: []\n",
    "scalar document": "just text\n",
    "empty document": "",
    "comment only": "# nothing here\n",
}


@pytest.mark.parametrize("text", DOCUMENTS.values(), ids=DOCUMENTS.keys())
def test_documents_load_as_safe_load_loads_them(text: str) -> None:
    assert load_yaml(text) == yaml.safe_load(text)


def test_an_alias_shares_its_value_and_a_recursive_one_still_loads() -> None:
    shared = load_yaml("x: &n [1, 2]\ny: *n\n")
    assert shared["x"] is shared["y"]
    recursive = load_yaml("&r [1, *r]\n")
    assert recursive[0] == 1 and recursive[1] is recursive


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\n---\nb: 2\n",  # two documents
        "a: *nowhere\n",  # undefined alias
        "a: !!python/object:os.system x\n",  # not a safe tag
        "a: 1\nb: [unclosed\n",
        "a: {<<: *nowhere}\n",
        "a:\n  b: 1\n c: 2\n",  # bad indentation
    ],
)
def test_bad_documents_fail_as_safe_load_fails_at_the_same_line(text: str) -> None:
    with pytest.raises(yaml.YAMLError) as expected:
        yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError) as got:
        load_yaml(text)
    assert type(got.value) is type(expected.value)
    assert _line(got.value) == _line(expected.value)


def _line(error: yaml.YAMLError) -> int | None:
    mark = getattr(error, "problem_mark", None)
    return None if mark is None else int(mark.line)


@pytest.mark.parametrize(
    "value", ["!!int nope", "!!int ''", "!!float x", "!!bool maybe", "!!timestamp then"]
)
@pytest.mark.parametrize("merge", [False, True], ids=["plain", "with a merge key"])
def test_a_tagged_scalar_pyyaml_cannot_read_is_a_one_line_spec_error(
    tmp_path: Path, value: str, merge: bool
) -> None:
    path = tmp_path / "tagged.yaml"
    extra = "base: &b {x: 1}\nuses: {<<: *b}\n" if merge else ""
    path.write_text(f"{extra}name: x\nnodes:\n- name: a\n  devices:\n  - count: {value}\n")
    with pytest.raises(SpecError) as info:
        load_cluster(path)
    assert str(info.value).startswith(f"cluster: {path} is not valid YAML")
    if not merge:
        assert str(info.value).endswith(" at line 5")


def test_a_big_spec_loads_to_the_same_cluster_in_both_forms(tmp_path: Path) -> None:
    types = known_types()
    per_device = [
        {"name": f"n{i}", "devices": [{"type": types[(i + j) % len(types)]} for j in range(8)]}
        for i in range(128)
    ]
    counted = [
        {"name": f"n{i}", "devices": [{"type": types[i % len(types)], "count": 8}]}
        for i in range(128)
    ]
    for nodes in (per_device, counted):
        path = tmp_path / "big.yaml"
        path.write_text(yaml.safe_dump({"name": "big", "nodes": nodes}))
        cluster = load_cluster(path)
        assert cluster == parse_cluster(yaml.safe_load(path.read_text()))
        assert len(cluster.devices) == 1024 and cluster.devices[-1].id == "n127/7"


def test_nodes_sharing_one_device_list_by_alias_get_their_own_devices(tmp_path: Path) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text(
        "name: pods\nnodes:\n"
        "- {name: a, devices: &pod [{type: H100-80GB, count: 2}, {type: L4-24GB}]}\n"
        "- {name: b, devices: *pod}\n"
    )
    cluster = load_cluster(path)
    assert cluster.ids == ["a/0", "a/1", "a/2", "b/0", "b/1", "b/2"]
    assert [d.type for d in cluster.devices if d.node == "b"] == ["H100-80GB"] * 2 + ["L4-24GB"]


def _nodes_with_last_entry(last: dict[str, Any]) -> list[dict[str, Any]]:
    """Three nodes of identical valid entries, then a node whose third entry is ``last``."""
    good = {"type": "L4-24GB", "count": 1, "memory_gb": 20}
    nodes = [{"name": f"n{i}", "devices": [dict(good) for _ in range(4)]} for i in range(3)]
    nodes.append({"name": "n3", "devices": [dict(good), dict(good), last]})
    return nodes


@pytest.mark.parametrize(
    ("last", "message"),
    [
        # equal to the valid entries under ==, but not valid
        (
            {"type": "L4-24GB", "count": True, "memory_gb": 20},
            "nodes[3].devices[2].count: must be an integer >= 1, got True",
        ),
        (
            {"type": "L4-24GB", "count": 1, "memory_gb": "20"},
            "nodes[3].devices[2].memory_gb: must be a number >= 0.001, got '20'",
        ),
        (
            {"type": "L4-24GB", "count": 1, "memory_gb": 20, "gpus": 2},
            "nodes[3].devices[2].gpus: unknown key; allowed: count, memory_gb, tflops, type",
        ),
        (
            {"type": "L4-24GB", "count": [1], "memory_gb": 20},
            "nodes[3].devices[2].count: must be an integer >= 1, got [1]",
        ),
    ],
)
def test_an_error_after_many_identical_entries_names_its_own_entry(
    last: dict[str, Any], message: str
) -> None:
    assert spec_error({"name": "t", "nodes": _nodes_with_last_entry(last)}) == message


def test_identical_entries_with_different_overrides_keep_their_own_figures() -> None:
    nodes = [
        {"name": "a", "devices": [{"type": "T4-16GB", "memory_gb": 15}, {"type": "T4-16GB"}]},
        {"name": "b", "devices": [{"type": "t4-16gb", "memory_gb": 15.0}, {"type": "T4-16GB"}]},
    ]
    cluster = parse_cluster({"name": "t", "nodes": nodes})
    assert [d.memory_gb for d in cluster.devices] == [15, 16, 15, 16]
    assert {d.type for d in cluster.devices} == {"T4-16GB"}


def test_a_fault_on_an_unknown_device_still_lists_the_known_ones_in_order() -> None:
    data = {
        "name": "t",
        "nodes": [{"name": "a", "devices": [{"type": "T4-16GB", "count": 3}]}],
        "simulation": {"faults": [{"device": "a/9", "at_step": 1, "kind": "crash"}]},
    }
    assert spec_error(data).endswith("unknown device 'a/9'; known: a/0, a/1, a/2")


def test_garbage_collection_is_back_as_it_was_after_a_load(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("name: x\nnodes: [{name: a, devices: [{type: T4-16GB}]}]\n")
    bad.write_text("name: x\nnodes: [{name: a, devices: [{type: nope}]}]\n")
    assert gc.isenabled()
    load_cluster(good)
    assert gc.isenabled()
    with pytest.raises(SpecError):
        load_cluster(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        load_cluster(good)
        assert not gc.isenabled(), "a caller's choice to run without collection is kept"
    finally:
        gc.enable()


def test_without_libyaml_the_python_parser_reads_the_same(tmp_path: Path) -> None:
    """PyYAML built without libyaml has no ``CSafeLoader``: specs still load, as before."""
    probe = (
        "import json, sys, yaml\n"
        "del yaml.CSafeLoader\n"
        "from scheduler.hardware.fast_yaml import _LOADER, load_yaml\n"
        "assert _LOADER is yaml.SafeLoader, _LOADER\n"
        "texts = json.loads(sys.stdin.read())\n"
        "print(json.dumps([load_yaml(t) == yaml.safe_load(t) for t in texts]))\n"
    )
    texts = [
        DOCUMENTS[k] for k in ("plain spec", "anchors and aliases", "merge keys", "nested flow")
    ]
    result = subprocess.run(
        [sys.executable, "-c", probe],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [True] * len(texts)


def test_devices_are_found_by_id_in_any_copy_of_a_cluster(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("name: lab\nnodes:\n- {name: a, devices: [{type: T4-16GB, count: 3}]}\n")
    cluster = load_cluster(path)
    assert cluster.device("a/2").index == 2
    part = cluster.subset(["a/2", "a/0"])
    assert part.ids == ["a/0", "a/2"] and part.device("a/2") == cluster.device("a/2")
    with pytest.raises(SpecError, match=r"^device: unknown id 'a/1'; known: a/0, a/2$"):
        part.device("a/1")
    assert pickle.loads(pickle.dumps(cluster)).device("a/1") == cluster.device("a/1")
    assert "_by_id" not in repr(cluster)
