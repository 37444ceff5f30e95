"""Many jobs on one cluster: the policy's allocation, moves, ``/schedule``, job fields.

The live tests run apps over the module's local Ray (the bundled four-GPU
local-sim cluster) and the session's profile cache (``live`` in conftest.py);
each app has its own database and policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.cli import build_parser
from api.commands.serve import settings_from_args
from scheduler.errors import HetschedError
from tests.support import JOBS, TERMINAL, wait_for

SCHEDULE = "/api/v1/schedule"
TINY = {"model": "gpt-tiny", "global_batch": 8, "strategy": "dp"}


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"priority": 0}, "priority: Input should be greater than 0, got 0"),
        ({"priority": "high"}, "priority: Input should be a valid number"),
        ({"min_devices": 0}, "min_devices: Input should be greater than or equal to 1, got 0"),
        ({"max_devices": 1.5}, "max_devices: Input should be a valid integer"),
        ({"min_devices": 3, "max_devices": 2}, "max_devices: 2 is below min_devices 3"),
        ({"min_devices": 5}, "min_devices: 5 is more than the cluster's 4 devices"),
        ({"max_devices": 9}, "max_devices: 9 is more than the cluster's 4 devices"),
        (
            {"devices": ["node-a/0"], "min_devices": 2},
            "min_devices: 2 is more than the 1 device(s) the job names in devices",
        ),
    ],
)
def test_bad_priority_or_device_counts_are_one_line_422s(
    offline: TestClient, body: dict[str, Any], detail: str
) -> None:
    answer = offline.post(JOBS, json={**TINY, **body})
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith(detail)
    assert "\n" not in answer.json()["detail"]


def test_job_fields_are_kept_and_the_schedule_names_the_policy(offline: TestClient) -> None:
    job = offline.post(
        JOBS, json={**TINY, "priority": 2.5, "min_devices": 2, "max_devices": 3}
    ).json()
    assert (job["spec"]["priority"], job["spec"]["min_devices"], job["spec"]["max_devices"]) == (
        2.5,
        2,
        3,
    )
    schedule = offline.get(SCHEDULE).json()
    assert schedule["policy"] == "goodput"  # the default
    assert schedule["decided_at"] is None  # the executor is off: nothing was decided
    assert set(schedule["devices"]) == {"node-a/0", "node-a/1", "node-b/0", "node-b/1"}


def test_three_jobs_run_side_by_side_on_devices_the_policy_chose(
    live: Callable[..., TestClient],
) -> None:
    """Three jobs queued at once under fair start together on disjoint devices,
    /schedule says who holds what and why, and all of them finish. (``fair`` runs every
    job that fits; ``goodput`` may keep one waiting for the fastest device, as it does
    here: least remaining time first.)"""
    # Queued while the executor is off, so its first round sees all three: submitted one
    # by one to a running executor, an 8-step job with a cached profile may start (and
    # finish) alone before the next one arrives.
    with live(policy="fair", executor=False) as queue:
        ids = [
            queue.post(JOBS, json={**TINY, "name": f"j{i}", "steps": 8, "seed": i}).json()["id"]
            for i in range(3)
        ]
    with live(policy="fair") as client:
        seen: list[dict[str, Any]] = []

        def all_running(_: dict[str, Any]) -> bool:
            # A round lists the jobs it starts as running before it publishes its decision
            # (decided_at, solver and rates still the previous round's, here none yet).
            schedule = client.get(SCHEDULE).json()
            rows = [j for j in schedule["jobs"] if j["id"] in ids and j["status"] == "running"]
            if len(rows) == 3 and schedule["decided_at"] is not None:
                seen.append(schedule)
            return bool(seen)

        wait_for(client, ids[-1], all_running)
        schedule = seen[-1]
        assert schedule["policy"] == "fair" and schedule["rates"] == {"gpt-tiny": "measured"}
        assert "integer program" in schedule["solver"]
        held = [set(row["held"]) for row in schedule["jobs"]]
        assert all(held) and sum(map(len, held)) == len(set().union(*held)), "disjoint devices"
        assert {d: j for d, j in schedule["devices"].items() if j} == {
            d: row["id"] for row in schedule["jobs"] for d in row["held"]
        }
        for row in schedule["jobs"]:
            assert "samples/s" in row["reason"] and row["samples_per_s"] > 0
        done = [wait_for(client, i, lambda j: j["state"] in TERMINAL) for i in ids]
    assert [j["state"] for j in done] == ["SUCCEEDED"] * 3, [j["message"] for j in done]
    for job in done:
        start = job["allocations"][0]
        assert start["from_devices"] == [] and start["policy"] == "fair"
    # Side by side: every job started before any of them ended.
    assert max(j["started_at"] for j in done) < min(j["ended_at"] for j in done)


def test_a_running_job_is_moved_through_its_checkpoint(
    live: Callable[..., TestClient],
) -> None:
    """A job runs alone; a second job comes with a high priority and, when the first holds
    several devices, needs one more than is free: the policy moves the first at a step
    boundary (off the fastest device, or onto fewer). It checkpoints, hands devices over
    and goes on from that checkpoint on its new devices, one metrics row per step."""
    with live(policy="goodput", reallocation_s=0) as client:
        big = client.post(JOBS, json={**TINY, "name": "big", "steps": 400}).json()
        alone = wait_for(client, big["id"], lambda j: j["steps_done"] >= 2)
        first = alone["allocations"][0]["devices"]
        need = 4 - len(first) + 1 if len(first) >= 2 else 1
        small = client.post(
            JOBS,
            json={**TINY, "name": "small", "steps": 4, "min_devices": need, "priority": 100},
        ).json()
        moved = wait_for(client, big["id"], lambda j: len(j["allocations"]) >= 2)
        move = moved["allocations"][1]
        assert set(move["from_devices"]) <= set(first) and move["devices"] != first
        assert move["policy"] == "goodput" and "samples/s" in move["reason"]
        finished = wait_for(client, small["id"], lambda j: j["state"] in TERMINAL)
        assert finished["state"] == "SUCCEEDED", finished["message"]
        assert not set(finished["allocations"][0]["devices"]) & set(move["devices"])
        wait_for(client, big["id"], lambda j: j["steps_done"] > move["step"] + 1)
        client.post(f"{JOBS}/{big['id']}/stop")
        after = wait_for(client, big["id"], lambda j: j["state"] in TERMINAL, 60)
        assert after["state"] == "STOPPED"
        assert "restart" not in [e["kind"] for e in after["events"]]  # a move is no restart
        steps = client.get(f"{JOBS}/{big['id']}/metrics").json()["data"]
        assert [s["step"] for s in steps] == list(range(after["steps_done"]))
        logs = [line["message"] for line in client.get(f"{JOBS}/{big['id']}/logs").json()["data"]]
        assert any(m.startswith("goodput: moved from") for m in logs)


def test_serve_takes_the_policy_and_round_from_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETSCHED_POLICY", raising=False)
    args = build_parser("serve").parse_args(["serve", "--policy", "fair", "--round-s", "5"])
    settings = settings_from_args(args)
    assert (settings.policy, settings.round_s) == ("fair", 5.0)
    with pytest.raises(SystemExit):
        build_parser("serve").parse_args(["serve", "--policy", "fastest"])
    bad = build_parser("serve").parse_args(["serve", "--round-s", "0"])
    with pytest.raises(HetschedError, match="^round_s: "):
        settings_from_args(bad)
