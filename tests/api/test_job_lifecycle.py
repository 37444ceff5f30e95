"""Jobs really run: submit -> RUNNING -> SUCCEEDED on the local simulated cluster.

One local Ray for the module (the bundled local-sim cluster, 2 CPUs) and one
profile cache, so gpt-tiny is measured once; every test has its own database.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import DEFAULT_CLUSTER, Settings
from api.store import RESTART_MESSAGE
from scheduler.cluster import load_cluster

JOBS = "/api/v1/jobs"
TERMINAL = {"STOPPED", "SUCCEEDED", "FAILED"}
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    from workers.session import start_local_ray

    start_local_ray(load_cluster(DEFAULT_CLUSTER), num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profile-cache")


@pytest.fixture
def live(
    local_ray: None, cache_dir: Path, tmp_path: Path, settings_factory: Callable[..., Settings]
) -> Callable[[], TestClient]:
    """A client over an app with the executor running on the shared local Ray."""

    def build() -> TestClient:
        return TestClient(create_app(settings_factory(tmp_path, cache_dir=cache_dir)))

    return build


def wait_for(
    client: TestClient,
    job_id: str,
    done: Callable[[dict[str, Any]], bool],
    timeout_s: float = TIMEOUT_S,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"{JOBS}/{job_id}").json()
        if done(job):
            return job
        assert time.monotonic() < deadline, f"timed out; job is {job['state']}: {job['message']}"
        time.sleep(0.1)


def test_job_runs_to_success_with_metrics(live: Callable[[], TestClient]) -> None:
    with live() as client:
        spec = {
            "name": "life",
            "model": "gpt-tiny",
            "global_batch": 16,
            "steps": 4,
            "seed": 1,
            "strategy": "dp",
        }
        job = client.post(JOBS, json=spec).json()
        running = wait_for(client, job["id"], lambda j: j["state"] != "PENDING")
        assert running["state"] in {"RUNNING", "SUCCEEDED"}, running["message"]
        done = wait_for(client, job["id"], lambda j: j["state"] in TERMINAL)
        assert done["state"] == "SUCCEEDED", done["message"]
        assert done["steps_done"] == 4 and done["progress"] == 1.0
        assert done["started_at"] <= done["ended_at"]
        plan = done["plan"]
        assert sum(d["samples"] for d in plan["devices"]) == 16
        assert done["predicted_step_s"] == plan["predicted_step_s"] > 0
        assert done["measured_step_s"] > 0 and done["samples_per_s"] > 0

        metrics = client.get(f"{JOBS}/{job['id']}/metrics").json()
        assert [s["step"] for s in metrics["data"]] == [0, 1, 2, 3]
        losses = [s["loss"] for s in metrics["data"]]
        # A byte-level model starts near ln(256) = 5.55 and learns.
        assert all(math.isfinite(x) for x in losses) and 3.0 < losses[0] < 7.0
        active = {d["id"] for d in plan["devices"] if d["samples"] > 0}
        for step in metrics["data"]:
            assert {d["id"] for d in step["devices"]} == active
            assert all(d["busy_s"] > 0 and d["peak_bytes"] > 0 for d in step["devices"])
        assert client.get(f"{JOBS}/{job['id']}/metrics", params={"since": 3}).json()["count"] == 1

        logs = [line["message"] for line in client.get(f"{JOBS}/{job['id']}/logs").json()["data"]]
        assert any(m.startswith("plan dp:") for m in logs)
        assert logs[-1] == "SUCCEEDED: finished 4 steps"

        cluster = client.get("/api/v1/cluster").json()
        devices = [d for n in cluster["nodes"] for d in n["devices"]]
        assert cluster["available"] and all(d["status"] == "idle" for d in devices)
        assert all(d["measured"]["model"] == "gpt-tiny" for d in devices)
        assert client.get("/api/v1/profiles").json()["count"] >= 1
        # Measured figures are cached: profiling again and a dry run are instant.
        profiled = client.post("/api/v1/cluster/profile", json={"model": "gpt-tiny"}).json()
        assert profiled["source"] == "measured" and len(profiled["profile"]["devices"]) == 4
        preview = client.post("/api/v1/plans", json={"global_batch": 16, "strategy": "dp"}).json()
        assert preview["profile_source"] == "measured"
        assert preview["plan"]["devices"] == plan["devices"]  # same profile, same split
        assert 'hetsched_jobs{state="SUCCEEDED"} 1.0' in client.get("/metrics").text
        assert client.delete(f"{JOBS}/{job['id']}").status_code == 200


def test_disjoint_jobs_stop_and_restart(live: Callable[[], TestClient]) -> None:
    """Two jobs on disjoint devices run at once; a whole-cluster job waits; stop ends one
    mid-run; a restart keeps every record and fails the job that was still running."""
    with live() as client:
        a = client.post(
            JOBS,
            json={
                "name": "a",
                "global_batch": 8,
                "steps": 500,
                "devices": ["node-a/0", "node-a/1"],
            },
        ).json()
        b = client.post(
            JOBS,
            json={
                "name": "b",
                "global_batch": 8,
                "steps": 500,
                "devices": ["node-b/0", "node-b/1"],
            },
        ).json()
        c = client.post(JOBS, json={"name": "c", "global_batch": 8, "steps": 1}).json()
        wait_for(client, a["id"], lambda j: j["steps_done"] >= 1)
        wait_for(client, b["id"], lambda j: j["steps_done"] >= 1)
        assert client.get(f"{JOBS}/{a['id']}").json()["state"] == "RUNNING"
        waiting = client.get(f"{JOBS}/{c['id']}").json()
        assert waiting["state"] == "PENDING" and waiting["message"].startswith("waiting for")

        refused = client.delete(f"{JOBS}/{a['id']}")
        assert refused.status_code == 409 and "RUNNING" in refused.json()["detail"]
        text = client.get("/metrics").text
        assert 'hetsched_jobs{state="RUNNING"} 2.0' in text
        assert f'hetsched_job_step_seconds{{job="{a["id"]}"}}' in text
        holders = {
            d["id"]: d["job_id"]
            for n in client.get("/api/v1/cluster").json()["nodes"]
            for d in n["devices"]
            if d["status"] == "busy"
        }
        assert set(holders.values()) == {a["id"], b["id"]}

        assert client.post(f"{JOBS}/{a['id']}/stop").json()["stop_requested"] is True
        stopped = wait_for(client, a["id"], lambda j: j["state"] in TERMINAL, 60)
        assert stopped["state"] == "STOPPED", stopped["message"]
        assert 1 <= stopped["steps_done"] < 500
        assert stopped["message"] == f"stopped on request after {stopped['steps_done']} steps"
        # c still waits: b holds node-b's devices. Stopping it while pending is immediate.
        assert client.get(f"{JOBS}/{c['id']}").json()["state"] == "PENDING"
        assert client.post(f"{JOBS}/{c['id']}/stop").json()["state"] == "STOPPED"
        b_steps = wait_for(client, b["id"], lambda j: j["steps_done"] >= 2)["steps_done"]
    # The control plane goes away while b runs; a new one opens the same database.
    with live() as client:
        jobs = {j["name"]: j for j in client.get(JOBS).json()["data"]}
        assert {n: j["state"] for n, j in jobs.items()} == {
            "a": "STOPPED",
            "b": "FAILED",
            "c": "STOPPED",
        }
        after = jobs["b"]
        assert after["message"] == RESTART_MESSAGE
        assert after["plan"] is not None and after["steps_done"] >= b_steps
        assert client.get(f"{JOBS}/{b['id']}/metrics").json()["count"] == after["steps_done"]
        assert client.get(f"{JOBS}/{a['id']}/metrics").json()["count"] == stopped["steps_done"]
