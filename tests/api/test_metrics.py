"""``/metrics`` is valid Prometheus exposition with stable names and live figures."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.execution.ledger import LiveJob

JOBS = "/api/v1/jobs"
STABLE = {
    "hetsched_jobs": "gauge",
    "hetsched_cluster_available": "gauge",
    "hetsched_device_busy_ratio": "gauge",
    "hetsched_device_memory_bytes": "gauge",
    "hetsched_device_memory_capacity_bytes": "gauge",
    "hetsched_job_samples_per_second": "gauge",
    "hetsched_job_step_seconds": "gauge",
    "hetsched_job_steps": "counter",  # exposed as hetsched_job_steps_total
}


def _scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {
            tuple(sorted(s.labels.items())): s.value
            for s in family.samples
            if not s.name.endswith("_created")
        }
        if family.name in STABLE:
            assert family.type == STABLE[family.name], family.name
    return families


def test_scrape_parses_with_every_stable_name(offline: TestClient) -> None:
    offline.post(JOBS, json={"steps": 2, "global_batch": 4})
    metrics = _scrape(offline)
    assert set(STABLE) <= set(metrics)
    assert metrics["hetsched_jobs"][(("state", "PENDING"),)] == 1
    assert metrics["hetsched_jobs"][(("state", "RUNNING"),)] == 0
    assert metrics["hetsched_cluster_available"][()] == 0
    capacity = metrics["hetsched_device_memory_capacity_bytes"]
    key = (("device", "node-b/1"), ("node", "node-b"), ("type", "T4-16GB"))
    assert capacity[key] > 0 and len(capacity) == 4
    assert "process_cpu_seconds_total" in {
        s.name
        for f in text_string_to_metric_families(offline.get("/metrics").text)
        for s in f.samples
    }


def test_running_jobs_figures_come_from_the_executor(
    offline: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job's latest step, as the executor holds it, is what Prometheus sees."""

    class Executor:
        def live(self) -> list[LiveJob]:
            job = LiveJob(job_id="abc", devices=["node-a/0"], step_s=0.5, samples_per_s=64.0)
            job.steps_done = 7
            job.device_steps = {"node-a/0": (0.4, 0.1, 1_000_000)}
            return [job]

    monkeypatch.setattr(offline.app.state.hetsched, "executor", Executor())  # type: ignore[attr-defined]
    metrics = _scrape(offline)
    assert metrics["hetsched_job_step_seconds"] == {(("job", "abc"),): 0.5}
    assert metrics["hetsched_job_samples_per_second"] == {(("job", "abc"),): 64.0}
    assert metrics["hetsched_job_steps"] == {(("job", "abc"),): 7}
    device = (("device", "node-a/0"), ("node", "node-a"), ("type", "A100-80GB"))
    assert metrics["hetsched_device_busy_ratio"][device] == 0.8
    assert metrics["hetsched_device_memory_bytes"][device] == 1_000_000
    idle = (("device", "node-b/0"), ("node", "node-b"), ("type", "V100-16GB"))
    assert metrics["hetsched_device_busy_ratio"][idle] == 0
