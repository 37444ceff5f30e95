"""``/metrics`` is valid Prometheus exposition with stable names and live figures."""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.execution.job_runner import JobHooks, JobRunner, RunningMedian
from api.execution.ledger import LiveJob
from workers.records import DeviceStep, HostBound, Recovery, StepMetrics

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
    "hetsched_job_step_duration_seconds": "histogram",
    "hetsched_job_loss": "gauge",
    "hetsched_job_validation_loss": "gauge",
    "hetsched_job_info": "gauge",  # an info metric; the text format has no such type
    "hetsched_job_events": "counter",
    "hetsched_device_job": "gauge",
    "hetsched_queue_length": "gauge",
    "hetsched_queue_wait_seconds": "histogram",
    "hetsched_checkpoint_duration_seconds": "histogram",
    "hetsched_recovery_duration_seconds": "histogram",
    "hetsched_http_requests": "counter",
    "hetsched_http_request_duration_seconds": "histogram",
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

    job_id = offline.post(JOBS, json={"name": "demo", "steps": 9, "global_batch": 4}).json()["id"]

    class Executor:
        def live(self) -> list[LiveJob]:
            job = LiveJob(job_id=job_id, devices=["node-a/0"], step_s=0.5, samples_per_s=64.0)
            job.steps_done = 7
            job.device_steps = {"node-a/0": (0.4, 0.1, 1_000_000)}
            return [job]

        def busy_devices(self) -> dict[str, str]:
            return {"node-a/0": job_id}

    monkeypatch.setattr(offline.app.state.hetsched, "executor", Executor())  # type: ignore[attr-defined]
    metrics = _scrape(offline)
    # "job_id", not "job": Prometheus' own target label would rename it exported_job.
    assert metrics["hetsched_job_step_seconds"] == {(("job_id", job_id),): 0.5}
    assert metrics["hetsched_job_samples_per_second"] == {(("job_id", job_id),): 64.0}
    info = (("job_id", job_id), ("model", "gpt-tiny"), ("name", "demo"), ("owner", "admin"))
    where = (("project", "default"), ("strategy", "auto"))  # single-user: the admin's
    assert metrics["hetsched_job_info"] == {(*info, *where): 1}
    device = (("device", "node-a/0"), ("node", "node-a"), ("type", "A100-80GB"))
    held = tuple(sorted((*device, ("job_id", job_id))))
    assert metrics["hetsched_device_job"] == {held: 1}
    assert metrics["hetsched_device_busy_ratio"][device] == 0.8
    assert metrics["hetsched_device_memory_bytes"][device] == 1_000_000
    idle = (("device", "node-b/0"), ("node", "node-b"), ("type", "V100-16GB"))
    assert metrics["hetsched_device_busy_ratio"][idle] == 0


def _hooks(client: TestClient, job_id: str) -> JobHooks:
    """The job runner's real hooks over the app's store and telemetry, as a run gets them."""
    state = client.app.state.hetsched  # type: ignore[attr-defined]
    runner = JobRunner(
        store=state.store,
        handle=state.handle,
        profiler=state.profiler,
        settings=state.settings,
        release=lambda live, devices: None,
        claim=lambda live, devices: devices,
        telemetry=client.app.state.telemetry,  # type: ignore[attr-defined]
    )
    job = state.store.get(job_id)
    return JobHooks(runner=runner, job=job, live=LiveJob(job_id=job_id, devices=["node-a/0"]))


def _step(step: int, loss: float, val_loss: float | None = None) -> StepMetrics:
    device = DeviceStep(id="node-a/0", busy_s=0.03, wait_s=0.01, peak_bytes=1000)
    return StepMetrics(
        step=step, loss=loss, step_s=0.04, samples_per_s=100.0, devices=(device,), val_loss=val_loss
    )


def test_counters_only_go_up_through_a_resume_and_a_delete(offline: TestClient) -> None:
    """steps_total fell when a job resumed from a checkpoint, events_total when a job was
    deleted (both were read from database rows): Prometheus takes a fall for a restart."""
    job_id = offline.post(JOBS, json={"steps": 6, "global_batch": 4}).json()["id"]
    hooks = _hooks(offline, job_id)
    for step in range(5):
        hooks.on_step(_step(step, 5.0 - step, val_loss=4.2 if step == 4 else None))
    recovery = Recovery(
        time_s=0.0,
        error="device lost",
        failed_step=5,
        resumed_step=3,
        lost=("node-b/1",),
        old_plan={},
        new_plan={},
        recover_s=7.5,
    )
    hooks.on_recovery(recovery)
    for step in (3, 4, 5):  # resumed from the checkpoint of step 2: steps 3 and 4 run again
        hooks.on_step(_step(step, 2.0))
    before = _scrape(offline)
    assert before["hetsched_job_steps"] == {(("job_id", job_id),): 8}
    assert before["hetsched_job_step_duration_seconds"][(("job_id", job_id), ("le", "0.05"))] == 8
    assert before["hetsched_job_loss"] == {(("job_id", job_id),): 2.0}
    assert before["hetsched_job_validation_loss"] == {(("job_id", job_id),): 4.2}
    assert before["hetsched_job_events"][(("kind", "recovery"),)] == 1
    assert before["hetsched_recovery_duration_seconds"][(("le", "10.0"),)] == 1
    offline.post(f"{JOBS}/{job_id}/stop")
    assert offline.delete(f"{JOBS}/{job_id}").status_code == 200
    after = _scrape(offline)
    assert after["hetsched_job_steps"] == before["hetsched_job_steps"]
    assert after["hetsched_job_events"] == before["hetsched_job_events"]


def test_http_requests_are_counted_by_route_template(offline: TestClient) -> None:
    for job_id in ("nope1", "nope2"):
        offline.get(f"{JOBS}/{job_id}")
    offline.get(JOBS, headers={"host": "evil.example"})
    metrics = _scrape(offline)
    requests = metrics["hetsched_http_requests"]
    route = (("method", "GET"), ("route", "/api/v1/jobs/{job_id}"), ("status", "404"))
    assert requests[route] == 2
    assert requests[(("method", "GET"), ("route", "unmatched"), ("status", "400"))] == 1
    assert (("le", "+Inf"), ("method", "GET"), ("route", "/api/v1/jobs/{job_id}")) in metrics[
        "hetsched_http_request_duration_seconds"
    ]


def test_promtool_finds_nothing_to_fix(offline: TestClient) -> None:
    """``promtool check metrics``: Prometheus' own lint of names, types, units and help."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; .ci/run does)")
    job_id = offline.post(JOBS, json={"steps": 2, "global_batch": 4}).json()["id"]
    _hooks(offline, job_id).on_step(_step(0, 5.0, val_loss=5.1))
    text = offline.get("/metrics").text
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


def test_a_host_bound_job_shows_one_event_and_one_warning(offline: TestClient) -> None:
    """What a user of the service sees when the host cannot keep a simulated GPU's pace:
    one ``host_bound`` event on GET /jobs/{id}, its line in the log, one counted event."""
    job_id = offline.post(JOBS, json={"steps": 6, "global_batch": 4}).json()["id"]
    hooks = _hooks(offline, job_id)
    notice = HostBound(step=2, lags=(("node-a/0", 1.43),))
    hooks.on_host_bound(notice)
    (event,) = offline.get(f"{JOBS}/{job_id}").json()["events"]
    assert (event["kind"], event["step"]) == ("host_bound", 2)
    assert event["data"]["message"] == (
        "host-bound: this host cannot keep node-a/0's pace (compute 1.4x its paced time); "
        "speeds of this job are not those of its GPUs"
    )
    logs = offline.get(f"{JOBS}/{job_id}/logs").json()["data"]
    assert [line["level"] for line in logs if line["message"] == notice.message()] == ["WARNING"]
    assert _scrape(offline)["hetsched_job_events"][(("kind", "host_bound"),)] == 1


def test_the_jobs_step_time_is_the_median_after_its_warm_up_step(offline: TestClient) -> None:
    """``measured_step_s`` as the API shows it: the first step alone, then the median of
    the steps after it, kept step by step (not re-sorted from every step's time)."""
    job_id = offline.post(JOBS, json={"steps": 6, "global_batch": 4}).json()["id"]
    hooks = _hooks(offline, job_id)
    seen = []
    for step, step_s in enumerate((5.0, 0.3, 0.1, 0.2, 0.9)):
        hooks.on_step(replace(_step(step, 1.0), step_s=step_s))
        seen.append(offline.get(f"{JOBS}/{job_id}").json()["measured_step_s"])
    assert seen == pytest.approx([5.0, 0.3, 0.2, 0.2, 0.25])


def test_the_running_median_agrees_with_statistics_median() -> None:
    rng = random.Random(7)
    for _ in range(50):
        times = [
            rng.choice((rng.random(), rng.random() * 10, 1.0)) for _ in range(rng.randint(1, 40))
        ]
        median = RunningMedian()
        for n, x in enumerate(times, start=1):
            median.add(x)
            assert median.value == pytest.approx(statistics.median(times[1:n] or times[:1]))
