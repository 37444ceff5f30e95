"""Fault injection: the spec's ``simulation.faults``, ``--fault`` and the schedule of a run."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scheduler.errors import SpecError
from scheduler.hardware.cluster import cluster_to_dict, parse_cluster, with_faults
from scheduler.hardware.faults import Fault, FaultSchedule, parse_fault
from tests.support import spec_error

IDS = ["node-a/0", "node-a/1", "node-b/0", "node-b/1"]


def spec(faults: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "nodes": [
            {"name": "node-a", "devices": [{"type": "A100-80GB"}, {"type": "L4-24GB"}]},
            {"name": "node-b", "devices": [{"type": "V100-16GB"}, {"type": "T4-16GB"}]},
        ],
        "simulation": {"memory_scale": 0.0015, "faults": faults},
    }


def test_spec_faults_become_records_in_spec_order() -> None:
    cluster = parse_cluster(
        spec(
            [
                {"device": "node-b/1", "at_step": 40, "kind": "lost"},
                {"device": "node-a/0", "at_step": 10, "kind": "slow", "factor": 3},
                {"device": "node-a/0", "at_step": 30, "kind": "restore"},
                {"device": "node-a/1", "at_step": 5, "kind": "crash"},
            ]
        )
    )
    assert cluster.simulation.faults == (
        Fault(device="node-b/1", at_step=40, kind="lost"),
        Fault(device="node-a/0", at_step=10, kind="slow", factor=3.0),
        Fault(device="node-a/0", at_step=30, kind="restore"),
        Fault(device="node-a/1", at_step=5, kind="crash"),
    )


def test_faults_round_trip_through_cluster_to_dict() -> None:
    cluster = parse_cluster(
        spec(
            [
                {"device": "node-a/0", "at_step": 10, "kind": "slow", "factor": 2.5},
                {"device": "node-b/1", "at_step": 40, "kind": "lost"},
            ]
        )
    )
    document = cluster_to_dict(cluster)
    assert document["simulation"]["faults"][0] == {
        "device": "node-a/0",
        "at_step": 10,
        "kind": "slow",
        "factor": 2.5,
    }
    assert parse_cluster(yaml.safe_load(yaml.safe_dump(document))) == cluster


def test_a_spec_without_faults_writes_no_faults_key() -> None:
    document = cluster_to_dict(parse_cluster(spec([])))
    assert document["simulation"] == {"memory_scale": 0.0015}


def fault_entry(**changes: Any) -> dict[str, Any]:
    """A valid crash fault on ``node-a/0`` at step 1, with ``changes`` over it."""
    return {"device": "node-a/0", "at_step": 1, "kind": "crash", **changes}


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (
            fault_entry(device="node-c/0"),
            "simulation.faults[0].device: unknown device 'node-c/0'; known: node-a/0, node-a/1",
        ),
        (
            fault_entry(kind="melt"),
            "simulation.faults[0].kind: unknown 'melt'; allowed: crash, lost, slow, restore",
        ),
        (
            fault_entry(kind="lost", factor=2),
            "simulation.faults[0].factor: only kind slow takes a factor, not kind lost",
        ),
        (fault_entry(at_step=-1), "simulation.faults[0].at_step: must be an integer >= 0, got -1"),
        (
            fault_entry(at_step=2.5),
            "simulation.faults[0].at_step: must be an integer >= 0, got 2.5",
        ),
        (
            fault_entry(kind="slow"),
            "simulation.faults[0].factor: kind slow needs a number > 0, got None",
        ),
        (
            fault_entry(kind="slow", factor=0),
            "simulation.faults[0].factor: kind slow needs a number > 0, got 0",
        ),
        (
            fault_entry(when=3),
            "simulation.faults[0].when: unknown key; allowed: at_step, device, factor, kind",
        ),
        ("node-a/0@1:crash", "simulation.faults[0]: must be a mapping, got str"),
    ],
)
def test_bad_spec_faults_name_the_field_and_what_is_allowed(fault: Any, expected: str) -> None:
    assert spec_error(spec([fault])).startswith(expected)


def test_faults_must_be_a_list() -> None:
    assert spec_error(spec({"device": "node-a/0"})).startswith(
        "simulation.faults: must be a list, got dict"
    )


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("node-b/1@40:lost", Fault(device="node-b/1", at_step=40, kind="lost")),
        ("node-a/0@10:slow=3", Fault(device="node-a/0", at_step=10, kind="slow", factor=3.0)),
        ("node-a/0@10:slow=0.5", Fault(device="node-a/0", at_step=10, kind="slow", factor=0.5)),
        ("node-a/0@30:restore", Fault(device="node-a/0", at_step=30, kind="restore")),
        ("node-a/1@0:crash", Fault(device="node-a/1", at_step=0, kind="crash")),
        (" node-a/1@7:Lost ", Fault(device="node-a/1", at_step=7, kind="lost")),
    ],
)
def test_parse_fault_reads_the_command_line_form(text: str, fault: Fault) -> None:
    assert parse_fault(text, IDS) == fault
    assert parse_fault(str(fault)) == fault, "str() gives the --fault form back"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node-a/0:slow", "expected DEVICE@STEP:KIND with KIND one of crash, lost, slow=FACTOR"),
        ("node-a/0@ten:lost", "STEP must be an integer >= 0, got 'ten'"),
        ("node-a/0@-1:lost", "STEP must be an integer >= 0, got '-1'"),
        ("node-a/0@3:melt", "unknown kind 'melt'; allowed: crash, lost, slow=FACTOR, restore"),
        ("node-a/0@3:slow", "slow needs =FACTOR, a number > 0, e.g. slow=3, got None"),
        ("node-a/0@3:slow=fast", "slow needs =FACTOR, a number > 0, e.g. slow=3, got 'fast'"),
        ("node-a/0@3:slow=-2", "slow needs =FACTOR, a number > 0"),
        ("node-a/0@3:lost=2", "only slow takes =FACTOR, not lost"),
        ("node-z/0@3:lost", "unknown device 'node-z/0'; known: node-a/0, node-a/1"),
    ],
)
def test_bad_fault_arguments_say_what_is_allowed(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_fault(text, IDS)
    message = str(info.value)
    assert message.startswith(f"--fault {text!r}: ")
    assert expected in message
    assert "\n" not in message


def test_with_faults_appends_command_line_faults_to_the_spec() -> None:
    cluster = parse_cluster(
        spec([{"device": "node-a/0", "at_step": 10, "kind": "slow", "factor": 3}])
    )
    more = with_faults(cluster, [parse_fault("node-b/1@40:lost")])
    assert [str(f) for f in more.simulation.faults] == ["node-a/0@10:slow=3", "node-b/1@40:lost"]
    with pytest.raises(SpecError, match=r"--fault 'node-c/0@4:crash': unknown device 'node-c/0'"):
        with_faults(cluster, [parse_fault("node-c/0@4:crash")])


def test_a_subset_keeps_only_its_devices_faults() -> None:
    cluster = parse_cluster(
        spec(
            [
                {"device": "node-a/0", "at_step": 10, "kind": "slow", "factor": 3},
                {"device": "node-b/1", "at_step": 40, "kind": "lost"},
            ]
        )
    )
    assert [f.device for f in cluster.subset(["node-a/0", "node-a/1"]).simulation.faults] == [
        "node-a/0"
    ]


def test_schedule_slowdown_holds_until_restore() -> None:
    schedule = FaultSchedule(
        [parse_fault("node-a/0@10:slow=3"), parse_fault("node-a/0@30:restore")]
    )
    factors = [schedule.slowdown("node-a/0", step) for step in (0, 9, 10, 29, 30, 99)]
    assert factors == [1.0, 1.0, 3.0, 3.0, 1.0, 1.0]
    assert schedule.slowdown("node-a/1", 15) == 1.0
    assert schedule.slowdowns(15) == {"node-a/0": 3.0}
    assert schedule.slowdowns(30) == {}


def test_schedule_a_second_slowdown_replaces_the_first() -> None:
    schedule = FaultSchedule([parse_fault("a/0@5:slow=2"), parse_fault("a/0@8:slow=4")])
    assert [schedule.slowdown("a/0", s) for s in (5, 7, 8)] == [2.0, 2.0, 4.0]


def test_schedule_lost_devices_stay_lost_until_restored() -> None:
    schedule = FaultSchedule(
        [
            parse_fault("node-b/1@40:lost"),
            parse_fault("node-a/1@45:lost"),
            parse_fault("node-b/1@50:restore"),
        ]
    )
    assert schedule.lost(39) == frozenset()
    assert schedule.lost(40) == {"node-b/1"}
    assert schedule.lost(47) == {"node-b/1", "node-a/1"}
    assert schedule.lost(50) == {"node-a/1"}


def test_schedule_events_fire_at_their_step_in_the_given_order() -> None:
    faults = [
        parse_fault("node-a/0@12:restore"),
        parse_fault("node-a/1@7:crash"),
        parse_fault("node-a/0@7:slow=2"),
    ]
    schedule = FaultSchedule(faults)
    assert schedule.firing(7) == (faults[1], faults[2])
    assert schedule.firing(8) == ()
    assert schedule.crashes(7) == ("node-a/1",)
    assert schedule.crashes(12) == ()
    assert bool(schedule) and not FaultSchedule([])


def test_fault_records_check_themselves() -> None:
    with pytest.raises(SpecError, match="factor: only kind slow takes a factor"):
        Fault(device="a/0", at_step=1, kind="crash", factor=2.0)
    with pytest.raises(SpecError, match="at_step: must be an integer >= 0"):
        Fault(device="a/0", at_step=-3, kind="crash")
