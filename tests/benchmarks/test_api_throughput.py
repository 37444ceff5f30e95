"""How fast the control plane answers dashboards while a job trains.

    .venv/bin/python -m pytest tests/benchmarks/test_api_throughput.py -m benchmark -s

``hetsched serve`` in its own process trains a long gpt-tiny job on the
embedded simulation; 50 clients, each one keep-alive connection, poll
``GET /api/v1/jobs/{id}`` as fast as answers come for 10 s, first as threads of
one process, then spread over five. The clients are raw sockets sending one
pre-built request and reading only the answer's length, so that on this machine's
two cores they cost the service no more than dashboards elsewhere would. Printed
for each: requests/s, p50, p99 and max latency; then the steps the job made
meanwhile, and the load average, since the figures mean little without it on a
shared machine. The issue's target is p99 under 50 ms; the bound asserted here is
loose, so that a loaded machine does not fail it (compare printed figures, side by
side).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support import serving

pytestmark = pytest.mark.benchmark

NUM_CLIENTS = 50
POLL_S = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("serve")) as service:
        yield service.url


def training_job(url: str) -> str:
    """A job that trains for longer than the benchmark, once its first step is done."""
    body = {"name": "bench", "model": "gpt-tiny", "global_batch": 32, "steps": 10_000}
    job = httpx.post(f"{url}/api/v1/jobs", json=body, timeout=30).json()
    start = time.monotonic()
    while True:
        state = httpx.get(f"{url}/api/v1/jobs/{job['id']}", timeout=30).json()
        if state["steps_done"] >= 1:
            return str(job["id"])
        assert state["state"] in ("PENDING", "RUNNING"), state["message"]
        assert time.monotonic() - start < 600
        time.sleep(0.05)


def request_bytes(url: str, path: str) -> bytes:
    """One keep-alive ``GET path``, encoded once for every poll."""
    parsed = urlsplit(url)
    return f"GET {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\n\r\n".encode("ascii")


def read_response(sock: socket.socket, buffer: bytearray) -> int:
    """Receive one whole response (its body by ``Content-Length``) from ``sock``: its
    status. ``buffer`` keeps what came after it, for the next one."""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        buffer += _received(sock)
    head = bytes(buffer[:end]).lower()
    at = head.find(b"\r\ncontent-length:")
    assert at >= 0, head  # every answer of this route says its length
    line_end = head.find(b"\r\n", at + 2)
    length = int(head[at + 17 : line_end if line_end >= 0 else None])
    total = end + 4 + length
    while len(buffer) < total:
        buffer += _received(sock)
    del buffer[:total]
    return int(head[9:12])


def _received(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError("the service closed the connection")
    return chunk


def poll_with_threads(url: str, job_id: str, num_clients: int) -> tuple[list[float], list[int]]:
    """``num_clients`` threads, each a keep-alive connection polling as fast as answers
    come: their latencies and any status that was not 200.

    Each client costs the shared cores what a dashboard on another machine would cost
    this one: nothing but its socket calls. The request is encoded once and the
    response is only framed (status and ``Content-Length``), never parsed; with
    ``http.client`` (or an asyncio httpx client, more still) fifty pollers took as much
    CPU as the service and their threads queued for their own interpreter lock, and
    that was measured as the service's latency.
    """
    parsed = urlsplit(url)
    request = request_bytes(url, f"/api/v1/jobs/{job_id}")
    latencies: list[float] = []
    failures: list[int] = []

    def one_client() -> None:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buffer = bytearray()
            mine: list[float] = []
            end = time.monotonic() + POLL_S
            while time.monotonic() < end:
                t0 = time.perf_counter()
                sock.sendall(request)
                status = read_response(sock, buffer)
                mine.append(time.perf_counter() - t0)
                if status != 200:
                    failures.append(status)
        latencies.extend(mine)

    threads = [threading.Thread(target=one_client) for _ in range(num_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures


def poll(url: str, job_id: str, processes: int = 1) -> list[float]:
    """NUM_CLIENTS pollers, spread over ``processes`` client processes: in one process,
    fifty threads queue for its interpreter lock, and that wait is counted as the
    service's latency."""
    share = NUM_CLIENTS // processes
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(
            pool.map(
                poll_with_threads, [url] * processes, [job_id] * processes, [share] * processes
            )
        )
    failures = [status for _, failed in results for status in failed]
    assert not failures, failures[:5]
    return sorted(latency for latencies, _ in results for latency in latencies)


def summary(latencies: list[float]) -> str:
    p50 = statistics.median(latencies)
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    return (
        f"{len(latencies) / POLL_S:.0f} requests/s, p50 {p50 * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms"
    )


def test_fifty_pollers_while_a_job_trains(server: str) -> None:
    job_id = training_job(server)
    before = httpx.get(f"{server}/api/v1/jobs/{job_id}").json()["steps_done"]
    load = os.getloadavg()
    rows = {processes: poll(server, job_id, processes) for processes in (1, 5)}
    job = httpx.get(f"{server}/api/v1/jobs/{job_id}").json()
    httpx.post(f"{server}/api/v1/jobs/{job_id}/stop")
    print(f"\nGET /jobs/{{id}}, {NUM_CLIENTS} clients, {POLL_S:.0f} s each way, while training:")
    for processes, latencies in rows.items():
        print(f"  clients in {processes} process(es): {summary(latencies)}")
    print(
        f"  the job made {job['steps_done'] - before} steps meanwhile; load average "
        f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    assert job["state"] == "RUNNING"
    for latencies in rows.values():  # loose: a shared 2-core machine swings these 3x
        assert latencies[int(0.99 * (len(latencies) - 1))] < 5.0
