"""Profiles: analytic figures from the catalogue, the JSON round trip, and bad documents."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.cost.profile import (
    analytic_profile,
    load_profile,
    profile_from_dict,
    save_profile,
    with_derived_recompute,
)
from scheduler.errors import ProfileError
from scheduler.hardware.capacity import catalogue_budget_bytes
from scheduler.hardware.catalogue import GIB, lookup
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import get_preset
from tests.support import one_line_error

CLUSTER = parse_cluster(
    {
        "name": "t",
        "nodes": [
            {"name": "a", "devices": [{"type": "A100-80GB"}, {"type": "T4-16GB"}]},
            {"name": "b", "devices": [{"type": "V100-16GB", "memory_gb": 12}]},
        ],
        "links": {"intra_node_gbps": 300, "inter_node_gbps": 25},
    }
)

DESIGN_PROFILE: dict[str, Any] = {
    "model": "gpt-tiny",
    "devices": [
        {
            "id": "node-a/0",
            "node": "node-a",
            "type": "A100-80GB",
            "capacity_bytes": 85899345920,
            "static_bytes": 40000000,
            "per_sample_bytes": 2500000,
            "fixed_s": 0.004,
            "per_sample_s": 0.0011,
        }
    ],
    "links": {"intra_node_gbps": 600, "inter_node_gbps": 100},
    "gradient_bytes": 3400000,
}


def profile_error(data: Any) -> str:
    return one_line_error(ProfileError, profile_from_dict, data)


def with_device(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(DESIGN_PROFILE)
    data["devices"][0].update(changes)
    return {**data, "devices": [{k: v for k, v in data["devices"][0].items() if v is not ...}]}


def test_analytic_profile_follows_catalogue_and_model() -> None:
    model = get_preset("gpt2-small")
    profile = analytic_profile(CLUSTER, model, efficiency=0.5, precision="auto")
    a100, t4, v100 = profile.devices
    assert profile.model == "gpt2-small" and profile.source == "analytic"
    assert profile.gradient_bytes == model.gradient_bytes
    assert profile.links.inter_node_gbps == 25
    # The roofline: never faster than the FLOPs at the sustained rate, and within a few
    # tens of per cent of it for a model this size (the rest is elementwise traffic).
    compute_floor = model.flops_per_sample / (312e12 * 0.5)
    assert compute_floor < a100.per_sample_s < 1.5 * compute_floor
    # The 70 W T4 sustains a smaller share of its peak than the A100.
    assert t4.per_sample_s / a100.per_sample_s > 312 / 65
    assert a100.capacity_bytes == catalogue_budget_bytes(80 * GIB)
    assert v100.capacity_bytes == catalogue_budget_bytes(12 * GIB), "memory_gb override"
    assert a100.static_bytes == model.model_state_bytes
    assert a100.per_sample_bytes == model.activation_bytes_per_sample
    assert a100.full is not None and a100.selective is not None
    assert a100.full.per_sample_bytes == model.activation_bytes_per_sample_with("full")
    assert a100.full.per_sample_s == pytest.approx(
        a100.per_sample_s + model.num_layers * a100.layers.block.per_sample_s / 3  # type: ignore[union-attr]
    )
    # Fixed time: the weights read three times at memory bandwidth, plus launches.
    bandwidth = lookup("T4-16GB").bandwidth_gbps * 1e9
    assert t4.fixed_s > 6 * model.num_params / bandwidth
    assert a100.layers is not None and a100.layers.num_blocks == model.num_layers


def test_efficiency_scales_time_and_must_be_a_fraction() -> None:
    model = get_preset("gpt2-medium")
    fast = analytic_profile(CLUSTER, model, efficiency=0.8).devices[0]
    slow = analytic_profile(CLUSTER, model, efficiency=0.2).devices[0]
    # Compute time scales by 4; the memory-bound kernels do not.
    assert 2 * fast.per_sample_s < slow.per_sample_s <= 4 * fast.per_sample_s
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ProfileError, match=r"efficiency: must be in \(0, 1\]"):
            analytic_profile(CLUSTER, model, efficiency=bad)


def test_max_micro_batch_from_memory() -> None:
    device = profile_from_dict(DESIGN_PROFILE).devices[0]
    assert device.max_micro_batch() == (85899345920 - 40000000) // 2500000
    tight = profile_from_dict(with_device(capacity_bytes=40000000 + 2500000 * 3 + 1)).devices[0]
    assert tight.max_micro_batch() == 3
    too_small = profile_from_dict(with_device(capacity_bytes=40000000 + 2499999)).devices[0]
    assert too_small.max_micro_batch() == 0


def test_design_profile_parses() -> None:
    profile = profile_from_dict(DESIGN_PROFILE)
    device = profile.device("node-a/0")
    assert (device.node, device.type, device.fixed_s) == ("node-a", "A100-80GB", 0.004)
    assert profile.gradient_bytes == 3400000
    assert profile.source == "measured", "documents without a source come from the profiler"


def test_json_round_trip_keeps_everything(tmp_path: Path) -> None:
    profile = analytic_profile(CLUSTER, get_preset("gpt2-small"))
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert json.loads(path.read_text())["devices"][0]["layers"]["num_blocks"] == 12
    assert profile_from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


@pytest.mark.parametrize(
    "field",
    ["capacity_bytes", "static_bytes", "per_sample_bytes", "fixed_s", "per_sample_s"],
)
def test_missing_field_is_named(field: str) -> None:
    message = profile_error(with_device(**{field: ...}))
    assert message == f"profile: devices[0].{field} is missing"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("capacity_bytes", -1, "devices[0].capacity_bytes must be a non-negative integer, got -1"),
        ("static_bytes", 1.5, "devices[0].static_bytes must be a non-negative integer, got 1.5"),
        ("per_sample_bytes", "2MB", "devices[0].per_sample_bytes must be a non-negative integer"),
        ("fixed_s", -0.1, "devices[0].fixed_s must be a non-negative number, got -0.1"),
        ("fixed_s", True, "devices[0].fixed_s must be a non-negative number, got True"),
        ("per_sample_s", 0, "devices[0].per_sample_s must be > 0, got 0"),
        ("per_sample_s", float("nan"), "devices[0].per_sample_s must be a non-negative number"),
        ("per_sample_s", None, "devices[0].per_sample_s must be a non-negative number"),
    ],
)
def test_bad_values_name_field_and_value(field: str, value: Any, expected: str) -> None:
    assert expected in profile_error(with_device(**{field: value}))


def test_duplicate_device_id() -> None:
    data = copy.deepcopy(DESIGN_PROFILE)
    data["devices"].append(copy.deepcopy(data["devices"][0]))
    assert profile_error(data) == "profile: devices[1].id 'node-a/0' appears twice"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], "profile: must be a JSON object"),
        ({**DESIGN_PROFILE, "model": ""}, "profile: model must be a non-empty string"),
        ({**DESIGN_PROFILE, "devices": []}, "profile: devices must be a non-empty list"),
        ({**DESIGN_PROFILE, "devices": [3]}, "profile: devices[0] must be an object"),
        (with_device(id=""), "profile: devices[0].id must be a non-empty string"),
        ({**DESIGN_PROFILE, "links": [1]}, "profile: links must be an object"),
        ({**DESIGN_PROFILE, "links": {"inter_node_gbps": 0}}, "links.inter_node_gbps must be > 0"),
        ({**DESIGN_PROFILE, "links": {"intra_node_gbps": "x"}}, "links.intra_node_gbps must be"),
        ({**DESIGN_PROFILE, "gradient_bytes": -3}, "gradient_bytes must be a non-negative"),
        (with_device(layers={"num_blocks": 2}), "devices[0].layers.embed must be an object"),
    ],
)
def test_inconsistent_documents(data: Any, expected: str) -> None:
    assert expected in profile_error(data)


def test_files_that_are_not_profiles(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match=r"p\.json is not valid JSON \(line 1\)"):
        load_profile(path)
    with pytest.raises(ProfileError, match=r"profile: cannot read .*nope\.json"):
        load_profile(tmp_path / "nope.json")


def test_unknown_device_lookup() -> None:
    with pytest.raises(ProfileError, match="profile: no device 'x/9'"):
        profile_from_dict(DESIGN_PROFILE).device("x/9")


# --- recomputation figures ---------------------------------------------------------


def test_measured_recomputation_figures_round_trip_and_win_over_derived_ones() -> None:
    full = {"per_sample_bytes": 300000, "per_sample_s": 0.0015, "fixed_s": 0.005}
    data = with_device(recompute={"full": full})
    device = profile_from_dict(data).devices[0]
    assert device.full is not None
    assert (device.full.per_sample_bytes, device.full.per_sample_s) == (300000, 0.0015)
    assert device.full.fixed_s == 0.005
    again = json.loads(json.dumps(profile_from_dict(data).to_dict()))
    assert again["devices"][0]["recompute"]["full"] == full
    assert profile_from_dict(again) == profile_from_dict(data)


def test_missing_recomputation_figures_are_derived_from_the_presets_ratios() -> None:
    device = profile_from_dict(DESIGN_PROFILE).devices[0]  # gpt-tiny, measured, no figures
    model = get_preset("gpt-tiny")
    assert device.full is not None and device.selective is not None
    bytes_ratio = model.activation_bytes_per_sample_with("full") / model.activation_bytes_per_sample
    time_ratio = model.flops_per_sample_with("full") / model.flops_per_sample
    assert device.full.per_sample_bytes == round(2500000 * bytes_ratio)
    assert device.full.per_sample_s == pytest.approx(0.0011 * time_ratio)
    assert device.full.per_sample_bytes < device.selective.per_sample_bytes < 2500000


def test_devices_of_one_type_get_the_same_derived_figures_and_keep_their_ids() -> None:
    # profile_from_dict derives recomputation figures once per distinct set of figures
    cluster = parse_cluster(
        {
            "name": "two-types",
            "nodes": [
                {"name": "a", "devices": [{"type": "A100-80GB", "count": 3}]},
                {"name": "b", "devices": [{"type": "T4-16GB", "count": 3}]},
            ],
        }
    )
    document = analytic_profile(cluster, get_preset("gpt2-small")).without_recompute().to_dict()
    profile = profile_from_dict(document)
    preset = get_preset("gpt2-small")
    assert [d.id for d in profile.devices] == [d["id"] for d in document["devices"]]
    for device in profile.devices:
        plain = profile_from_dict({**document, "model": "my-own-net"}).device(device.id)
        assert device == with_derived_recompute(plain, preset)


def test_unknown_models_get_no_guessed_recomputation_figures() -> None:
    device = profile_from_dict({**DESIGN_PROFILE, "model": "my-own-net"}).devices[0]
    assert device.full is None and device.selective is None
    assert [o.recompute for o in device.options()] == ["none"]


def test_bad_recomputation_figures_are_named() -> None:
    message = profile_error(with_device(recompute={"partial": {}}))
    assert message == (
        "profile: devices[0].recompute.partial: unknown recomputation mode; "
        "allowed: selective, full"
    )
    message = profile_error(with_device(recompute={"full": {"per_sample_bytes": 10}}))
    assert message == "profile: devices[0].recompute.full.per_sample_s is missing"


def test_per_layer_block_figures_get_derived_recomputation_with_its_transient() -> None:
    piece = {"fixed_s": 0.001, "per_sample_s": 0.0002, "static_bytes": 1000, "per_sample_bytes": 0}
    block = {**piece, "per_sample_bytes": 600000}
    layers = {
        "num_blocks": 4,
        "embed": piece,
        "block": block,
        "head": piece,
        "boundary_bytes_per_sample": 16384,
    }
    device = profile_from_dict(with_device(layers=layers)).devices[0]
    assert device.layers is not None and device.layers.block.full is not None
    full = device.layers.block.full
    kept = get_preset("gpt-tiny").block_stored("full")
    plain = get_preset("gpt-tiny").block_stored("none")
    assert full.per_sample_bytes == round(600000 * kept.bytes / plain.bytes)
    assert full.transient_bytes_per_sample == round(600000 * kept.transient_bytes / plain.bytes)
    assert full.per_sample_s == pytest.approx(0.0002 * 4 / 3)
    assert device.layers.embed.full is None, "only blocks are recomputed"


def test_the_profilers_micro_batch_limit_scales_to_recomputation_modes() -> None:
    full = {"per_sample_bytes": 500000, "per_sample_s": 0.0015}
    data = with_device(micro_batch_limit=3, recompute={"full": full})
    device = profile_from_dict(data).devices[0]
    assert device.max_micro_batch() == 3, "the measured cap holds without recomputation"
    # five times less per sample: the cap grows with the memory it saves
    assert device.max_micro_batch(500000) == 15
    again = profile_from_dict(data).to_dict()["devices"][0]
    assert again["micro_batch_limit"] == 3 and again["recompute"]["full"] == full


def test_a_nodes_own_links_survive_the_document_and_bad_ones_name_the_node() -> None:
    links = {
        "intra_node_gbps": 256,
        "inter_node_gbps": 100,
        "nodes": {"nvlink": {"intra_node_gbps": 2400}},
    }
    profile = profile_from_dict({**DESIGN_PROFILE, "links": links})
    assert profile.links.between(["nvlink"]) == 2400
    assert profile.links.between(["other"]) == 256
    assert profile_from_dict(profile.to_dict()).links == profile.links
    bad = {**links, "nodes": {"nvlink": {"intra_node_gbps": -1}}}
    with pytest.raises(ProfileError, match=r"links\.nodes\.nvlink\.intra_node_gbps must be"):
        profile_from_dict({**DESIGN_PROFILE, "links": bad})
