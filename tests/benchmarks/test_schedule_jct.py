"""Three jobs at once on the service: total completion time under goodput vs fifo.

    .venv/bin/python -m pytest tests/benchmarks/test_schedule_jct.py -m benchmark -s

The bundled local-sim cluster (A100, L4, V100, T4 simulated on this machine's
CPU). For each policy a fresh app (own database) on one shared local Ray and
profile cache: a one-step warm-up job on every device starts all workers and
measures the profile, then three identical-size jobs (gpt-tiny, global batch 8,
``STEPS`` steps) are submitted together. A job's completion time (JCT) runs from
its submission to its end, as the store records them; the test compares the
sum of the three JCTs (the average JCT times three) and prints the makespan too.

Under fifo each job takes the whole cluster in turn; under goodput they run
side by side on the devices the policy picks, and when one ends the others
move (through a checkpoint) onto what it freed. On a tiny model a step's fixed
costs (dispatch, all-reduce) do not shrink with more devices, so splitting one
small batch four ways buys little, and running three jobs at once wins.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.api.conftest import local_ray, make_settings
from tests.support import JOBS, TERMINAL, wait_for

__all__ = ["local_ray"]  # the API tests' fixture: one local Ray of the local-sim cluster

pytestmark = pytest.mark.benchmark

STEPS = 30
REALLOCATION_S = 5.0
"""What a move costs on this service (checkpoint, re-plan, restore and the first step on
warm workers: a few seconds), so goodput moves a job onto devices another one freed."""
SPEC = {"model": "gpt-tiny", "global_batch": 8, "strategy": "dp", "steps": STEPS}
DEVICES = ["node-a/0", "node-a/1", "node-b/0", "node-b/1"]


def _run(policy: str, data_dir: Path, cache: Path) -> dict[str, Any]:
    settings = make_settings(
        data_dir, cache_dir=cache, policy=policy, reallocation_s=REALLOCATION_S
    )
    with TestClient(create_app(settings)) as client:
        warm = client.post(
            JOBS, json={**SPEC, "name": "warm", "steps": 1, "devices": DEVICES}
        ).json()
        assert wait_for(client, warm["id"], lambda j: j["state"] in TERMINAL)["state"] == (
            "SUCCEEDED"
        )
        ids = [
            client.post(JOBS, json={**SPEC, "name": f"j{i}", "seed": i}).json()["id"]
            for i in range(3)
        ]
        jobs = [wait_for(client, i, lambda j: j["state"] in TERMINAL, 900) for i in ids]
    assert [j["state"] for j in jobs] == ["SUCCEEDED"] * 3, [j["message"] for j in jobs]

    def at(text: str) -> float:
        return datetime.fromisoformat(text).timestamp()

    jct = [at(j["ended_at"]) - at(j["created_at"]) for j in jobs]
    makespan = max(at(j["ended_at"]) for j in jobs) - min(at(j["created_at"]) for j in jobs)
    held = [[a["devices"] for a in j["allocations"]] for j in jobs]
    return {"policy": policy, "jct_s": jct, "sum_s": sum(jct), "makespan_s": makespan, "held": held}


def test_goodput_finishes_three_jobs_sooner_in_total_than_fifo(
    local_ray: None, cache_dir: Path, tmp_path: Path
) -> None:
    results: list[dict[str, Any]] = []
    for policy in ("goodput", "fifo"):
        results.append(_run(policy, tmp_path / policy, cache_dir))
    for r in results:
        jcts = ", ".join(f"{x:.1f}" for x in r["jct_s"])
        print(
            f"\n{r['policy']:8s} sum of JCTs {r['sum_s']:.1f} s (each {jcts}); "
            f"makespan {r['makespan_s']:.1f} s; devices {r['held']}"
        )
    goodput, fifo = results
    assert goodput["sum_s"] < fifo["sum_s"]
