"""Submit → first step on a warm service: ``hetsched serve`` in its own process.

    .venv/bin/python -m pytest tests/benchmarks/test_warm_start.py -m benchmark -s

A first job measures the profile (cold); then five jobs are submitted one
after another on the default simulation cluster, each timed from the POST to
the moment its first step is recorded (polled every 20 ms). The median is
what a user of a warm service waits; it includes the first step's own compute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from tests.support import serving

pytestmark = pytest.mark.benchmark

NUM_JOBS = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("serve")) as service:
        yield service.url


def _submit_to_first_step_s(url: str) -> tuple[float, float, float]:
    """Seconds from the POST to the first step's record, and two parts of it: until the job
    started (queue) and the first step's own duration."""
    body = {"name": "warm", "model": "gpt-tiny", "global_batch": 32, "steps": 2, "strategy": "dp"}
    start = time.monotonic()
    job = httpx.post(f"{url}/api/v1/jobs", json=body, timeout=30).json()
    first = None
    while True:
        state = httpx.get(f"{url}/api/v1/jobs/{job['id']}", timeout=30).json()
        if first is None and state["steps_done"] >= 1:
            first = time.monotonic() - start
        if state["state"] not in ("PENDING", "RUNNING"):
            assert state["state"] == "SUCCEEDED", state["message"]
            assert first is not None
            break
        assert time.monotonic() - start < 600
        time.sleep(0.02)
    queued = datetime.fromisoformat(state["started_at"]) - datetime.fromisoformat(
        state["created_at"]
    )
    steps = httpx.get(f"{url}/api/v1/jobs/{job['id']}/metrics", timeout=30).json()["data"]
    return first, queued.total_seconds(), steps[0]["step_s"]


def test_submit_to_first_step_on_a_warm_service(server: str) -> None:
    cold = _submit_to_first_step_s(server)[0]  # measures the profile, warms everything
    runs = [_submit_to_first_step_s(server) for _ in range(NUM_JOBS)]
    warm = [r[0] for r in runs]
    print(
        f"\nsubmit -> first step: first job {cold:.2f} s (profiling); then "
        f"{', '.join(f'{w:.2f}' for w in warm)} s, median {statistics.median(warm):.2f} s "
        f"(of which queued {statistics.median(r[1] for r in runs):.2f} s, "
        f"first step itself {statistics.median(r[2] for r in runs):.2f} s)"
    )
