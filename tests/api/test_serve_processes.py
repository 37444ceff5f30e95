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
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from api.core.local_ray import LocalRaySession, RayProcess
from tests.support import JOBS, SERVE_EXIT_S, Serve, steady_env, wait_for

STEPS = 12


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
    deadline = time.monotonic() + SERVE_EXIT_S
    while _alive(processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(processes) == [], "Ray processes left behind"


def _start(data_dir: Path, cache_dir: Path) -> tuple[Serve, set[tuple[int, float]]]:
    """``hetsched serve`` on the data directory, up, and the Ray processes it started.

    With the session's profile cache, its steady margin and 2 CPUs, as the other tests'
    services and apps run the same embedded cluster: the restarted service reads the
    profile the first one (or, in a full run, a module before) measured, as a restarted
    service does on a steady host, rather than measuring it again under the load of the
    killed one's exit."""
    service = Serve(data_dir, "--num-cpus", "2", env=steady_env(cache_dir))
    service.wait_up()
    ray_processes = _tree(service.process.pid)
    names = {psutil.Process(pid).name() for pid, _ in ray_processes}
    assert any("raylet" in n for n in names), f"no raylet among {sorted(names)}"
    return service, ray_processes


def test_kill_9_mid_job_then_restart_finishes_the_job_and_sigterm_leaves_no_ray_process(
    tmp_path: Path, cache_dir: Path
) -> None:
    """SIGKILL of the service while a job trains: no cleanup runs. The next start ends
    the dead service's Ray processes, resumes the job from its last checkpoint, and the
    job finishes with exactly one metrics row per step. SIGTERM, as systemd or a container
    runtime stops it, then exits cleanly and leaves none of that service's Ray processes."""
    first, first_ray = _start(tmp_path, cache_dir)
    try:
        with first.client() as api:
            spec = {"name": "k9", "global_batch": 8, "steps": STEPS, "checkpoint_every": 3}
            job = api.post(JOBS, json=spec).json()
            wait_for(api, job["id"], lambda j: j["steps_done"] >= 5)
    finally:
        first.process.kill()
        first.process.wait(SERVE_EXIT_S)
    second, second_ray = _start(tmp_path, cache_dir)
    try:
        _assert_all_gone(first_ray)
        with second.client() as api:
            done = wait_for(api, job["id"], lambda j: j["state"] == "SUCCEEDED")
            (restart,) = [e for e in done["events"] if e["kind"] == "restart"]
            assert 3 <= restart["step"] < STEPS
            metrics = api.get(f"{JOBS}/{job['id']}/metrics").json()["data"]
        assert [m["step"] for m in metrics] == list(range(STEPS)), "one row a step"
        assert second.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
        _assert_all_gone(second_ray)
    finally:
        second.process.kill()


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
