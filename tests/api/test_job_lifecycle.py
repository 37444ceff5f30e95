"""Jobs really run: submit -> RUNNING -> SUCCEEDED on the local simulated cluster.

One local Ray for the module (the bundled local-sim cluster, 2 CPUs) and the
session's profile cache, so gpt-tiny is measured once; every test has its own
database (``live`` in conftest.py).
The apps run the ``fifo`` policy: these tests pin first-come-first-served
behaviour (a job naming no devices takes the whole cluster); the other
policies are tested in test_schedule.py.
"""

from __future__ import annotations

import io
import json
import math
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from scheduler.models.presets import get_preset
from tests.support import JOBS, TERMINAL, wait_for


def test_job_runs_to_success_with_metrics(live: Callable[[], TestClient]) -> None:
    # ``live`` holds the margin the profile is cached under (tests.support.STEADY_MARGIN):
    # a live probe between the job's profile and the second one below may read other
    # processes' exit and pick another margin level, which scales every cached time.
    with live() as client:
        spec = {
            "name": "life",
            "model": "gpt-tiny",
            "global_batch": 16,
            "steps": 4,
            "seed": 1,
            "strategy": "dp",
            "val_every": 2,
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
        # Validation loss on the held-out split after every second step, null on the others.
        val = [s["val_loss"] for s in metrics["data"]]
        assert val[0] is None and val[2] is None and 3.0 < val[1] < 7.0 and 3.0 < val[3] < 7.0

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
    mid-run; a restart keeps every record and resumes the job that was still running from
    its checkpoint."""
    with live() as client:
        a, b = (
            client.post(
                JOBS,
                json={
                    "name": name,
                    "global_batch": 8,
                    "steps": 500,
                    "devices": [f"{node}/0", f"{node}/1"],
                },
            ).json()
            for name, node in (("a", "node-a"), ("b", "node-b"))
        )
        c = client.post(JOBS, json={"name": "c", "global_batch": 8, "steps": 1}).json()
        started = wait_for(client, a["id"], lambda j: j["steps_done"] >= 1)
        assert [(e["policy"], e["devices"]) for e in started["allocations"]] == [
            ("pinned", ["node-a/0", "node-a/1"])  # it named them: no policy placed it
        ]
        wait_for(client, b["id"], lambda j: j["steps_done"] >= 1)
        assert client.get(f"{JOBS}/{a['id']}").json()["state"] == "RUNNING"
        waiting = client.get(f"{JOBS}/{c['id']}").json()
        assert waiting["state"] == "PENDING" and waiting["message"].startswith("waiting for")

        refused = client.delete(f"{JOBS}/{a['id']}")
        assert refused.status_code == 409 and "RUNNING" in refused.json()["detail"]
        text = client.get("/metrics").text
        assert 'hetsched_jobs{state="RUNNING"} 2.0' in text
        assert f'hetsched_job_step_seconds{{job_id="{a["id"]}"}}' in text
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
    # The control plane goes away while b runs (b checkpoints where it stops); a new one
    # opens the same database and resumes b from that checkpoint.
    with live() as client:
        jobs = {j["name"]: j for j in client.get(JOBS).json()["data"]}
        assert {n: j["state"] for n, j in jobs.items()} == {
            "a": "STOPPED",
            "b": "RUNNING",
            "c": "STOPPED",
        }
        resumed = wait_for(client, b["id"], lambda j: bool(j["events"]), 60)
        (restart,) = resumed["events"]
        assert restart["kind"] == "restart" and restart["step"] >= b_steps
        more = wait_for(client, b["id"], lambda j: j["steps_done"] > restart["step"] + 1)
        assert client.post(f"{JOBS}/{b['id']}/stop").status_code == 200
        after = wait_for(client, b["id"], lambda j: j["state"] in TERMINAL, 60)
        assert after["state"] == "STOPPED" and after["steps_done"] >= more["steps_done"]
        steps = client.get(f"{JOBS}/{b['id']}/metrics").json()["data"]
        assert [s["step"] for s in steps] == list(range(after["steps_done"])), "one row a step"
        checkpoints = client.get(f"{JOBS}/{b['id']}/checkpoints").json()["data"]
        assert checkpoints and checkpoints[-1]["step"] == after["steps_done"] - 1
        download = client.get(checkpoints[-1]["url"])
        assert download.status_code == 200
        with tarfile.open(fileobj=io.BytesIO(download.content), mode="r:gz") as tar:
            manifest = next(m for m in tar.getnames() if m.endswith("/manifest.json"))
            assert json.load(tar.extractfile(manifest))["step"] == checkpoints[-1]["step"]
        assert client.get(f"{JOBS}/{a['id']}/metrics").json()["count"] == stopped["steps_done"]


def test_a_crashed_and_a_lost_device_are_recovered_and_training_is_unchanged(
    live: Callable[[], TestClient],
) -> None:
    """A job's worker is killed (crash) and later a device is lost, over the fault API: the
    job re-plans without the lost device, restores its last checkpoint and finishes with the
    loss curve of an undisturbed run, one metrics row per step."""
    spec = {"global_batch": 8, "steps": 12, "strategy": "dp", "seed": 5, "checkpoint_every": 3}
    with live() as client:
        plain = client.post(JOBS, json={**spec, "name": "plain"}).json()
        plain = wait_for(client, plain["id"], lambda j: j["state"] in TERMINAL)
        want = [s["loss"] for s in client.get(f"{JOBS}/{plain['id']}/metrics").json()["data"]]

        job = client.post(JOBS, json={**spec, "name": "hit", "max_failures": 2}).json()
        wait_for(client, job["id"], lambda j: j["steps_done"] >= 4)
        victim = next(
            d["id"]
            for d in client.get(f"{JOBS}/{job['id']}").json()["plan"]["devices"]
            if d["samples"] > 0
        )
        crash = client.post(f"/api/v1/cluster/devices/{victim}/fail", json={"kind": "crash"})
        assert crash.status_code == 200, crash.text
        wait_for(client, job["id"], lambda j: len(j["events"]) >= 1)
        lost = client.post(f"/api/v1/cluster/devices/{victim}/fail", json={"kind": "lost"})
        assert lost.status_code == 200
        status = {
            d["id"]: d["status"]
            for n in client.get("/api/v1/cluster").json()["nodes"]
            for d in n["devices"]
        }
        assert status[victim] == "lost"
        done = wait_for(client, job["id"], lambda j: j["state"] in TERMINAL)
        client.post(f"/api/v1/cluster/devices/{victim}/restore")
        assert done["state"] == "SUCCEEDED", done["message"]
        kinds = [e["kind"] for e in done["events"]]
        assert kinds == ["recovery", "recovery"], done["events"]
        second = done["events"][1]["data"]
        assert second["lost"] == [victim] and second["steps_redone"] >= 0
        assert victim not in {d["id"] for d in done["plan"]["devices"] if d["samples"] > 0}
        steps = client.get(f"{JOBS}/{job['id']}/metrics").json()["data"]
        assert [s["step"] for s in steps] == list(range(12))
        assert [s["loss"] for s in steps] == pytest.approx(want, rel=1e-4)


def test_a_job_starts_from_a_hugging_face_directory(
    live: Callable[[], TestClient], tmp_path: Path
) -> None:
    """init_from hf:DIR: the first step's loss is the released weights' loss on that batch."""
    import torch

    from workers.data.dataset import ByteDataset
    from workers.models.families import build_model
    from workers.models.gpt import lm_loss_sum
    from workers.models.hf import save_hf_directory

    preset = get_preset("gpt-tiny")
    released = build_model(preset, seed=11)
    save_hf_directory(preset, released.state_dict(), tmp_path / "hub" / "released")
    x, y = ByteDataset(None, seq_len=preset.seq_len).device_batch(
        seed=1, step=0, global_batch=16, offset=0, samples=16
    )
    with torch.no_grad():
        want = float(lm_loss_sum(released(x), y)) / y.numel()
    with live() as client:
        spec = {"global_batch": 16, "steps": 1, "seed": 1, "strategy": "dp"}
        job = client.post(JOBS, json={**spec, "init_from": "hf:hub/released"}).json()
        done = wait_for(client, job["id"], lambda j: j["state"] in TERMINAL)
        assert done["state"] == "SUCCEEDED", done["message"]
        first = client.get(f"{JOBS}/{job['id']}/metrics").json()["data"][0]["loss"]
        assert first == pytest.approx(want, rel=1e-5)
        missing = client.post(JOBS, json={**spec, "init_from": "hf:hub/missing"}).json()
        failed = wait_for(client, missing["id"], lambda j: j["state"] in TERMINAL)
        assert failed["state"] == "FAILED"
        assert "init_from: no directory 'hub/missing'" in failed["message"]
