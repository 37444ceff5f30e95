"""``hetsched serve`` leaves no Ray process behind, however it is stopped, and a job
it was training when it was killed finishes after the next start.

The service runs as a real subprocess, as a user, systemd or a container
runtime runs it. Its Ray processes are found independently of the service's
own bookkeeping: every descendant of the service's pid while it is up
(GCS, raylet, monitors, the dashboard and runtime-env agents, workers),
named by pid and start time so a reused pid cannot pass for one of them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import httpx
import psutil
import pytest

from api.core.local_ray import LocalRaySession, RayProcess

STARTUP_S = 180.0
EXIT_S = 60.0
JOB_S = 300.0
STEPS = 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETSCHED_")}
    command = [sys.executable, "-m", "api.cli", "serve", "--data-dir", str(data_dir)]
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir / "serve.log").open("ab")  # what it said, for a failure's message
    return subprocess.Popen(
        [*command, "--port", str(port), "--num-cpus", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait_up(service: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if service.poll() is not None:
            log = Path(service.args[service.args.index("--data-dir") + 1]) / "serve.log"  # type: ignore[index,union-attr,arg-type]
            said = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            pytest.fail(f"hetsched serve exited with {service.returncode}:\n{said}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"hetsched serve did not answer /healthz within {STARTUP_S:.0f} s")


def _tree(pid: int) -> set[tuple[int, float]]:
    """(pid, start time) of every descendant of ``pid``."""
    found = set()
    for child in psutil.Process(pid).children(recursive=True):
        try:
            found.add((child.pid, child.create_time()))
        except psutil.Error:
            continue
    return found


def _alive(processes: set[tuple[int, float]]) -> list[str]:
    left = []
    for pid, created in processes:
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - created) < 0.01 and process.status() != "zombie":
                left.append(f"{pid} {process.name()}")
        except psutil.Error:
            continue
    return left


def _assert_all_gone(processes: set[tuple[int, float]]) -> None:
    deadline = time.monotonic() + EXIT_S
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(processes) == [], "Ray processes left behind"


def _start(data_dir: Path) -> tuple[subprocess.Popen[bytes], set[tuple[int, float]], int]:
    port = _free_port()
    service = _serve(data_dir, port)
    _wait_up(service, port)
    ray_processes = _tree(service.pid)
    names = {psutil.Process(pid).name() for pid, _ in ray_processes}
    assert any("raylet" in n for n in names), f"no raylet among {sorted(names)}"
    return service, ray_processes, port


def _wait_job(port: int, job_id: str, done: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + JOB_S
    while time.monotonic() < deadline:
        job = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs/{job_id}", timeout=10).json()
        if done(job):
            return job
        if job["state"] in ("FAILED", "STOPPED"):
            pytest.fail(f"job ended {job['state']}: {job['message']}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}: {job}")


def _sigterm(service: subprocess.Popen[bytes]) -> None:
    service.send_signal(signal.SIGTERM)
    service.wait(EXIT_S)


def test_sigterm_leaves_no_ray_process(tmp_path: Path) -> None:
    service, ray_processes, _ = _start(tmp_path)
    try:
        _sigterm(service)
        assert service.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
        _assert_all_gone(ray_processes)
    finally:
        service.kill()


def test_kill_9_mid_job_then_restart_finishes_the_job_and_ends_the_predecessors_ray(
    tmp_path: Path,
) -> None:
    """SIGKILL of the service while a job trains: no cleanup runs. The next start ends
    the dead service's Ray processes, resumes the job from its last checkpoint, and the
    job finishes with exactly one metrics row per step."""
    first, first_ray, port = _start(tmp_path)
    api = f"http://127.0.0.1:{port}/api/v1/jobs"
    job = httpx.post(
        api, json={"name": "k9", "global_batch": 8, "steps": STEPS, "checkpoint_every": 3}
    ).json()
    _wait_job(port, job["id"], lambda j: j["steps_done"] >= 5, "5 steps before the kill")
    first.kill()
    first.wait(EXIT_S)
    second, second_ray, port = _start(tmp_path)
    api = f"http://127.0.0.1:{port}/api/v1/jobs"
    try:
        _assert_all_gone(first_ray)
        done = _wait_job(port, job["id"], lambda j: j["state"] != "RUNNING", "the job's end")
        assert done["state"] == "SUCCEEDED", done["message"]
        (restart,) = [e for e in done["events"] if e["kind"] == "restart"]
        assert 3 <= restart["step"] < STEPS
        metrics = httpx.get(f"{api}/{job['id']}/metrics").json()["data"]
        assert [m["step"] for m in metrics] == list(range(STEPS)), "one row a step"
        _sigterm(second)
        _assert_all_gone(second_ray)
    finally:
        second.kill()


def test_a_live_services_ray_is_never_reaped(tmp_path: Path) -> None:
    """A record whose service is still running (this test process stands in for it)
    belongs to that service: a second start on the data directory leaves it alone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me, other = psutil.Process(os.getpid()), psutil.Process(child.pid)
        record = {
            "service": RayProcess(pid=me.pid, create_time=me.create_time(), name=me.name()),
            "processes": [
                RayProcess(pid=other.pid, create_time=other.create_time(), name=other.name())
            ],
        }
        session = LocalRaySession(tmp_path)
        session.path.write_text(json.dumps(record, default=asdict))
        assert session.reap_predecessor() == 0
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
