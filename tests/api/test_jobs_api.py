"""The REST API's answers to good and bad input, without Ray (the executor is off)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from api.store import JobStore

JOBS = "/api/v1/jobs"
TINY_JOB = {"name": "tiny", "model": "gpt-tiny", "global_batch": 16, "steps": 3}


def test_submit_answers_201_with_a_pending_job(offline: TestClient) -> None:
    response = offline.post(JOBS, json=TINY_JOB)
    assert response.status_code == 201
    job = response.json()
    assert job["state"] == "PENDING"
    assert job["spec"]["global_batch"] == 16 and job["steps"] == 3
    assert offline.get(f"{JOBS}/{job['id']}").json()["id"] == job["id"]


def test_repeated_submission_id_answers_200_with_the_same_job(offline: TestClient) -> None:
    body = {**TINY_JOB, "submission_id": "nightly-42"}
    first = offline.post(JOBS, json=body)
    again = offline.post(JOBS, json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert offline.get(JOBS).json()["count"] == 1


def test_invalid_spec_names_every_bad_field_on_one_line(offline: TestClient) -> None:
    bad = {
        "name": "x",
        "global_batch": 0,
        "strategy": "fastest",
        "optimizer": {"lr": -1},
        "colour": "red",
    }
    response = offline.post(JOBS, json=bad)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert "global_batch: Input should be greater than or equal to 1, got 0" in detail
    assert "strategy: must be one of" in detail and "dp" in detail
    assert "optimizer.lr:" in detail
    assert "colour: Extra inputs are not permitted" in detail


def test_unknown_model_is_422_and_unknown_device_409_naming_what_is_known(
    offline: TestClient,
) -> None:
    response = offline.post(JOBS, json={**TINY_JOB, "model": "gpt-99"})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("model: unknown preset 'gpt-99'; known: gpt-tiny")
    # A well-formed id this cluster lacks is a conflict with the server's state, not bad input.
    response = offline.post(JOBS, json={**TINY_JOB, "devices": ["node-a/0", "node-z/7"]})
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "devices: unknown id 'node-z/7'; known: node-a/0, node-a/1, node-b/0, node-b/1"
    )


def test_dataset_paths_escaping_the_data_dir_are_rejected(
    offline: TestClient, tmp_path: Path
) -> None:
    secret = tmp_path.parent / "secret.txt"
    secret.write_text("x" * 1000)
    for name in ("../secret.txt", str(secret), "/etc/passwd", "a/../../secret.txt"):
        response = offline.post(JOBS, json={**TINY_JOB, "dataset": name})
        assert response.status_code == 422, name
        assert response.json()["detail"].startswith("dataset: "), name
    (tmp_path / "corpus.txt").write_text("hello world " * 100)
    assert offline.post(JOBS, json={**TINY_JOB, "dataset": "corpus.txt"}).status_code == 201
    assert "corpus.txt" in offline.get("/api/v1/options").json()["datasets"]


def test_a_model_that_fits_nowhere_is_409_with_the_planner_reason(offline: TestClient) -> None:
    for path in (JOBS, "/api/v1/plans"):
        response = offline.post(
            path,
            json={**TINY_JOB, "model": "gpt2-xl"}
            if path == JOBS
            else {"model": "gpt2-xl", "global_batch": 8},
        )
        assert response.status_code == 409, path
        detail = response.json()["detail"]
        assert detail.startswith("no device can hold the model: node-a/0: model states")
        assert re.search(r"model states [\d.]+ GB exceed simulated capacity [\d.]+ MB", detail)


def test_dry_run_plan_has_baselines_and_trains_nothing(offline: TestClient) -> None:
    response = offline.post("/api/v1/plans", json={"model": "gpt-tiny", "global_batch": 64})
    assert response.status_code == 200
    preview = response.json()
    plan = preview["plan"]
    assert preview["profile_source"] == "analytic"  # Ray is off in this test
    assert sum(d["samples"] for d in plan["devices"]) == 64
    assert {"even", "proportional"} <= set(plan["baselines"])
    assert plan["predicted_step_s"] <= plan["baselines"]["even"]["predicted_step_s"]
    assert offline.get(JOBS).json()["count"] == 0


def test_unknown_ids_are_404(offline: TestClient) -> None:
    for method, path in (
        ("GET", "/nope"),
        ("GET", "/nope/metrics"),
        ("GET", "/nope/logs"),
        ("POST", "/nope/stop"),
        ("DELETE", "/nope"),
        ("GET", "/%E2%98%83"),
    ):
        response = offline.request(method, f"{JOBS}{path}")
        assert response.status_code == 404, (method, path)
        assert "no job with id" in response.json()["detail"]


def test_stop_pending_then_delete(offline: TestClient) -> None:
    job = offline.post(JOBS, json=TINY_JOB).json()
    assert offline.delete(f"{JOBS}/{job['id']}").status_code == 409  # not terminal yet
    stopped = offline.post(f"{JOBS}/{job['id']}/stop").json()
    assert stopped["state"] == "STOPPED"
    again = offline.post(f"{JOBS}/{job['id']}/stop")
    assert again.status_code == 409 and "already STOPPED" in again.json()["detail"]
    assert offline.delete(f"{JOBS}/{job['id']}").status_code == 200
    assert offline.get(f"{JOBS}/{job['id']}").status_code == 404


def test_paging_and_state_filter(offline: TestClient) -> None:
    ids = [offline.post(JOBS, json={**TINY_JOB, "name": f"j{i}"}).json()["id"] for i in range(5)]
    offline.post(f"{JOBS}/{ids[0]}/stop")
    page = offline.get(JOBS, params={"limit": 2, "offset": 1}).json()
    assert page["count"] == 5
    assert [j["id"] for j in page["data"]] == [ids[3], ids[2]]  # newest first
    stopped = offline.get(JOBS, params={"state": "STOPPED"}).json()
    assert [j["id"] for j in stopped["data"]] == [ids[0]] and stopped["count"] == 1
    bad = offline.get(JOBS, params={"state": "DONE", "limit": 0})
    assert bad.status_code == 422
    assert "state: Input should be 'PENDING'" in bad.json()["detail"]
    assert "limit: Input should be greater than or equal to 1" in bad.json()["detail"]


def test_token_guards_mutations_but_not_reads(app_client) -> None:  # type: ignore[no-untyped-def]
    with app_client(api_token="s3cret", open_reads=True) as client:
        assert client.post(JOBS, json=TINY_JOB).status_code == 401
        wrong = client.post(JOBS, json=TINY_JOB, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.post("/api/v1/plans", json={}).status_code == 401
        good = client.post(JOBS, json=TINY_JOB, headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 201
        job_id = good.json()["id"]
        assert client.post(f"{JOBS}/{job_id}/stop").status_code == 401
        assert client.delete(f"{JOBS}/{job_id}").status_code == 401
        assert client.get(JOBS).status_code == 200
        assert client.get(f"{JOBS}/{job_id}").status_code == 200
        assert client.get("/api/v1/cluster").status_code == 200


def test_records_survive_a_restart_and_running_jobs_stay_running(
    app_client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    with app_client() as client:
        kept = client.post(JOBS, json={**TINY_JOB, "name": "kept"}).json()["id"]
        cut = client.post(JOBS, json={**TINY_JOB, "name": "cut"}).json()
        store: JobStore = client.app.state.hetsched.store  # type: ignore[attr-defined]
        # What a crash mid-run leaves behind: RUNNING with a step stored.
        assert store.start(cut["id"], ["node-a/0"])
        store.add_step(
            cut["id"],
            step=0,
            loss=5.5,
            step_s=0.2,
            samples_per_s=80.0,
            devices=[],
            measured_step_s=0.2,
        )
    with app_client() as client:
        jobs = {j["name"]: j for j in client.get(JOBS).json()["data"]}
        assert set(jobs) == {"kept", "cut"}
        assert jobs["kept"]["id"] == kept and jobs["kept"]["state"] == "PENDING"
        # No executor here: nothing resumes it, and nothing it stored is lost.
        assert jobs["cut"]["state"] == "RUNNING"
        assert jobs["cut"]["steps_done"] == 1 and jobs["cut"]["last_loss"] == 5.5


def test_health_cluster_and_metrics_report_an_unavailable_cluster(offline: TestClient) -> None:
    health = offline.get("/healthz").json()
    assert health["status"] == "ok" and health["cluster"] == "unavailable"
    cluster = offline.get("/api/v1/cluster").json()
    assert cluster["available"] is False and cluster["num_devices"] == 4
    assert {d["status"] for n in cluster["nodes"] for d in n["devices"]} == {"unavailable"}
    offline.post(JOBS, json=TINY_JOB)
    text = offline.get("/metrics").text
    assert 'hetsched_jobs{state="PENDING"} 1.0' in text
    assert "# TYPE hetsched_device_busy_ratio gauge" in text
    assert 'hetsched_device_memory_capacity_bytes{device="node-b/1"' in text
    assert "hetsched_cluster_available 0.0" in text
    assert offline.post("/api/v1/cluster/profile", json={}).status_code == 409


def test_the_cluster_view_shows_a_nodes_own_links(app_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "two-boxes.yaml"
    spec.write_text(
        "name: two-boxes\n"
        "nodes:\n"
        "  - name: nvlink\n"
        "    devices: [{type: A100-80GB, count: 2}]\n"
        "    links: {intra_node_gbps: 2400}\n"
        "  - {name: pcie, devices: [{type: L4, count: 2}]}\n"
        "links: {intra_node_gbps: 256, inter_node_gbps: 25}\n"
    )
    with app_client(cluster=spec) as client:
        cluster = client.get("/api/v1/cluster").json()
    assert cluster["links"] == {"intra_node_gbps": 256, "inter_node_gbps": 25}
    assert {n["name"]: n["links"] for n in cluster["nodes"]} == {
        "nvlink": {"intra_node_gbps": 2400},
        "pcie": {},
    }


def test_openapi_is_served_with_the_job_routes(offline: TestClient) -> None:
    spec = offline.get("/api/v1/openapi.json").json()
    assert "/api/v1/jobs/{job_id}/metrics" in spec["paths"]
    assert offline.get("/docs").status_code == 200


def test_unreachable_ray_address_still_serves(app_client) -> None:  # type: ignore[no-untyped-def]
    with app_client(ray_address="127.0.0.1:1", start_ray=True) as client:
        assert client.get("/healthz").json()["cluster"] == "unavailable"
        cluster = client.get("/api/v1/cluster").json()
        assert cluster["available"] is False and cluster["simulated"] is False
        assert cluster["message"].startswith("cannot connect to Ray at 127.0.0.1:1:")
        job = client.post(JOBS, json=TINY_JOB)
        assert job.status_code == 201 and job.json()["state"] == "PENDING"
        plan = client.post("/api/v1/plans", json={})
        assert plan.status_code == 409 and plan.json()["detail"].startswith("cluster: unavailable")


def test_bad_model_dimensions_name_only_what_is_wrong(offline: TestClient) -> None:
    """A model given as dimensions is not also scolded for not being a preset name."""
    dims = {"num_layers": 1, "d_model": 10, "num_heads": 3, "d_ff": 8, "seq_len": 4}
    response = offline.post("/api/v1/plans", json={"model": {**dims, "vocab_size": 256}})
    assert response.status_code == 422
    assert response.json()["detail"] == "model: d_model 10 must be divisible by num_heads 3"
    response = offline.post(JOBS, json={"model": {**dims, "d_model": 12, "vocab_size": 25}})
    assert response.json()["detail"] == (
        "model.vocab_size: Input should be greater than or equal to 256, got 25"
    )


def test_llama_dimensions_take_grouped_query_attention(offline: TestClient) -> None:
    dims = {
        "family": "llama",
        "num_layers": 2,
        "d_model": 64,
        "num_heads": 4,
        "num_kv_heads": 2,
        "d_ff": 128,
        "vocab_size": 256,
        "seq_len": 32,
    }
    response = offline.post(JOBS, json={"model": dims, "global_batch": 4, "steps": 1})
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["model"]["num_kv_heads"] == 2
    response = offline.post(JOBS, json={"model": {**dims, "num_kv_heads": 3}})
    assert response.status_code == 422
    assert response.json()["detail"] == "model: num_heads 4 must be a multiple of num_kv_heads 3"
    response = offline.post(JOBS, json={"model": {**dims, "family": "gpt"}})
    assert response.status_code == 422
    assert "the gpt family has no grouped-query attention" in response.json()["detail"]


def test_validation_settings_and_init_from_are_checked(offline: TestClient) -> None:
    response = offline.post(
        JOBS, json={**TINY_JOB, "val_every": 5, "val_batches": 2, "init_from": "hf:models/x"}
    )
    assert response.status_code == 201, response.text
    spec = response.json()["spec"]
    assert (spec["val_every"], spec["val_batches"], spec["init_from"]) == (5, 2, "hf:models/x")
    for init_from in ("hf:../x", "hf:/etc", "hf:.hidden", "nothex", "abc@x"):
        response = offline.post(JOBS, json={**TINY_JOB, "init_from": init_from})
        assert response.status_code == 422, init_from
        assert response.json()["detail"].startswith("init_from: must be a job id"), init_from
    response = offline.post(JOBS, json={**TINY_JOB, "val_batches": 0})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("val_batches: Input should be greater")
