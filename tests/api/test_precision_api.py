"""A job's precision at the edges: the API's 409 (the cluster's devices lack it) and 422
(no such precision), and the command line's one-line errors."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.api.conftest import run_cli
from tests.support import JOBS, REPO

TINY_JOB = {"name": "tiny", "model": "gpt-tiny", "global_batch": 16, "steps": 3}
MIXED_LAB = str(REPO / "deploy" / "clusters" / "mixed-lab.yaml")


def test_bf16_on_a_cluster_with_a_v100_is_a_one_line_409_naming_the_field(
    offline: TestClient,
) -> None:
    """The bundled local-sim cluster has an A100, an L4, a V100 and a T4."""
    response = offline.post(JOBS, json={**TINY_JOB, "precision": "bf16"})
    assert response.status_code == 409  # a valid spec; this cluster's devices lack bf16
    detail = response.json()["detail"]
    assert "\n" not in detail
    assert detail.startswith("precision: bf16 is not supported by node-b/0 (V100-16GB")
    # the devices that have bf16, or auto, are accepted; the spec keeps what was asked
    ok = offline.post(JOBS, json={**TINY_JOB, "precision": "bf16", "devices": ["node-a/0"]})
    assert ok.status_code == 201 and ok.json()["spec"]["precision"] == "bf16"
    auto = offline.post(JOBS, json={**TINY_JOB, "precision": "auto"})
    assert auto.status_code == 201
    assert offline.post(JOBS, json=TINY_JOB).json()["spec"]["precision"] == "fp32"


def test_an_unknown_precision_is_a_422_listing_the_allowed_ones(offline: TestClient) -> None:
    response = offline.post(JOBS, json={**TINY_JOB, "precision": "fp8"})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("precision:") and "'fp32', 'bf16', 'fp16' or 'auto'" in detail


def test_plan_and_simulate_refuse_an_unsupported_precision_in_one_line(capsys) -> None:
    args = ["--cluster", MIXED_LAB, "--model", "gpt2-small", "--global-batch", "64"]
    code, out, err = run_cli(capsys, "plan", *args, "--precision", "bf16")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "precision: bf16 is not supported by node-b/0" in err
    # simulate checks before it starts Ray
    code, _, err = run_cli(capsys, "simulate", "--precision", "bf16", "--steps", "1")
    assert code == 2 and "precision: bf16 is not supported by node-b/0 (V100-16GB" in err


def test_plan_shows_each_devices_precision(capsys) -> None:
    args = ["--cluster", MIXED_LAB, "--model", "gpt2-small", "--global-batch", "64"]
    # even: every device computes, so each one's precision is in the plan
    code, out, _ = run_cli(
        capsys, "plan", *args, "--strategy", "even", "--precision", "auto", "--json"
    )
    assert code == 0
    precisions = {d["id"]: d["precision"] for d in json.loads(out)["devices"]}
    assert precisions == {
        "node-a/0": "bf16",
        "node-a/1": "bf16",
        "node-b/0": "fp16",
        "node-b/1": "fp16",
    }
    code, out, _ = run_cli(capsys, "plan", *args, "--precision", "auto")
    assert code == 0 and "PRECISION" in out and "bf16" in out


def test_a_plan_request_takes_the_jobs_precision(offline: TestClient) -> None:
    """``POST /plans`` prices the precision asked for (fp32 unless asked), and refuses one
    a device cannot run (409) or an unknown one (422), in one line."""
    plan = {"model": "gpt-tiny", "global_batch": 16, "strategy": "dp"}
    fp32 = offline.post("/api/v1/plans", json=plan)
    auto = offline.post("/api/v1/plans", json={**plan, "precision": "auto"})
    assert fp32.status_code == auto.status_code == 200
    precisions = {d["precision"] for d in fp32.json()["plan"]["devices"]}
    assert precisions == {"fp32"}
    assert "bf16" in {d["precision"] for d in auto.json()["plan"]["devices"]}
    bad = offline.post("/api/v1/plans", json={**plan, "precision": "bf16"})
    assert bad.status_code == 409  # valid input this cluster cannot run, as for a job
    assert bad.json()["detail"].startswith("precision: bf16 is not supported by node-b/0")
    unknown = offline.post("/api/v1/plans", json={**plan, "precision": "fp8"})
    assert unknown.status_code == 422 and "\n" not in unknown.json()["detail"]
    assert unknown.json()["detail"].startswith("precision:")
