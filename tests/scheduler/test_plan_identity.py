"""The planners give the plans they gave before they were made fast (issue 20).

``data/plans_before_issue20.json`` holds plans that the planners wrote before the
devices were grouped by kind (:class:`~scheduler.cost.table.DeviceTable`), the
data-parallel entries stored as columns and the hybrid search pruned and run per kind
of pipeline (commit a43462c): data-parallel plans of 8 to 200 mixed catalogue GPUs,
hybrid plans of 8 to 256, a pipeline of 16, with the analytic profiles they were
planned from (stored by kind, so that a later change of the speed model does not
change what is compared). Each is planned again here, from the profile's devices one
by one and from the same devices as a table, and must give every device the same
samples, micro-batches, offset, layers, stage, pipeline and recomputation, leave out
the same devices for the same reasons and predict the same times.
"""

from __future__ import annotations

import json
import math
import pickle
import random
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from scheduler.cost.costs import DeviceProfile
from scheduler.cost.profile import Profile, analytic_profile, profile_from_dict
from scheduler.cost.table import DeviceTable, kind_key
from scheduler.hardware.catalogue import known_types
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.plan import DevicePlanTable
from scheduler.planning.planner import make_plan

STORED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "plans_before_issue20.json").read_text()
)
CASES: list[dict[str, Any]] = STORED["cases"]
TIMES = ("predicted_step_s", "predicted_samples_per_s", "compute_s", "comm_s")


def _profile(index: int) -> Profile:
    """Stored profile ``index``, its devices one by one (as a profile document loads)."""
    doc = dict(STORED["profiles"][index])
    kinds = doc.pop("kinds")
    doc["devices"] = [{"id": i, "node": n, **kinds[k]} for i, n, k in doc["devices"]]
    return profile_from_dict(doc)


def _as_table(profile: Profile) -> Profile:
    """The same devices as a table: one object per kind of equal figures."""
    table = DeviceTable.grouped(
        profile.devices, key=lambda d: replace(d, id="", node=""), figures=lambda d: d
    )
    return replace(profile, devices=table)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['strategy']}-{case['global_batch']}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("as_table", [False, True], ids=["one-by-one", "table"])
def test_plan_is_the_one_planned_before(case: dict[str, Any], as_table: bool) -> None:
    profile = _profile(case["profile"])
    if as_table:
        profile = _as_table(profile)
    plan = make_plan(profile, case["global_batch"], case["strategy"]).to_dict()
    before = case["plan"]
    assert [d["id"] for d in plan["devices"]] == [d["id"] for d in before["devices"]]
    for new, old in zip(plan["devices"], before["devices"], strict=True):
        assert {k: v for k, v in new.items() if k != "busy_s"} == {
            k: v for k, v in old.items() if k != "busy_s"
        }
        assert _close(new["busy_s"], old["busy_s"]), new["id"]
    assert plan["excluded"] == before["excluded"]
    assert plan["notes"] == before["notes"]
    for key in TIMES:
        assert _close(plan[key], before[key]), key
    assert plan["baselines"].keys() == before["baselines"].keys()
    for name, baseline in before["baselines"].items():
        for key, value in baseline.items():
            assert _close(plan["baselines"][name][key], value), (name, key)


def _analytic(devices: int, seed: int = 0) -> Profile:
    """An analytic profile (a table) of ``devices`` random catalogue GPUs, eight a node."""
    rng = random.Random(seed)
    nodes = [
        {"name": f"node-{i}", "devices": [{"type": rng.choice(known_types())} for _ in range(8)]}
        for i in range(devices // 8)
    ]
    return analytic_profile(
        parse_cluster({"name": "mix", "nodes": nodes}), get_preset("gpt2-small")
    )


def test_a_table_plans_as_the_same_devices_one_by_one() -> None:
    """A profile whose devices are a table and one whose devices are a tuple of the same
    devices are equal and plan alike, down to the JSON text."""
    profile = _analytic(96)
    assert isinstance(profile.devices, DeviceTable)
    one_by_one = replace(profile, devices=tuple(profile.devices))
    assert one_by_one == profile and profile == one_by_one
    plan = make_plan(profile, 8 * 96 + 5, "dp")
    assert isinstance(plan.devices, DevicePlanTable)
    again = make_plan(one_by_one, 8 * 96 + 5, "dp")
    assert plan == again
    assert plan.to_json() == again.to_json()
    assert plan.to_json() == replace(plan, devices=tuple(plan.devices)).to_json()
    assert json.loads(plan.to_json()) == plan.to_dict()
    assert plan.devices[3] == tuple(plan.devices)[3] and plan.devices[-1].id == plan.devices[-1].id


def test_a_table_builds_each_device_with_every_field_of_its_kind() -> None:
    """:class:`DeviceTable` builds a device field by field: a field added to
    :class:`DeviceProfile` must be added there (and to its kind key) too."""
    assert {f.name for f in fields(DeviceProfile)} == {
        "id", "node", "type", "capacity_bytes", "static_bytes", "per_sample_bytes", "fixed_s",
        "per_sample_s", "layers", "micro_batch_limit", "selective", "full", "precision",
    }  # fmt: skip
    table = _analytic(16).devices
    assert isinstance(table, DeviceTable)
    for i, device in enumerate(table):
        kind = table.kinds[table.kind_of[i]]
        assert device == replace(kind, id=table.ids[i], node=table.nodes[i])
        assert kind_key(device) == kind_key(kind)


def test_tables_cross_to_workers_as_what_they_hold() -> None:
    """Profiles and plans travel to Ray workers and into the job store pickled: a table
    arrives as an equal table, not as a pile of rebuilt objects."""
    profile = _analytic(16)
    plan = make_plan(profile, 131, "dp")
    for value in (profile, plan):
        again = pickle.loads(pickle.dumps(value))
        assert again == value
    assert isinstance(pickle.loads(pickle.dumps(profile)).devices, DeviceTable)
    assert isinstance(pickle.loads(pickle.dumps(plan)).devices, DevicePlanTable)
