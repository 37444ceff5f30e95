"""Helpers every test room shares: small clusters, hand-written plans, jobs polled to an end,
and ``hetsched serve`` run as a user runs it (its own process, on a free port).

Imports only the standard library, httpx and scheduler types, so a test module that uses it
pays nothing for torch or Ray at collection.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import uvicorn

from scheduler.cost.profile import DeviceProfile
from scheduler.errors import SpecError
from scheduler.hardware.cluster import Cluster, parse_cluster
from scheduler.models.presets import get_preset
from scheduler.planning.plan import DevicePlan, Plan
from workers.run.config import TrainJob

REPO = Path(__file__).resolve().parents[1]
TINY = get_preset("gpt-tiny")
JOBS = "/api/v1/jobs"
TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
JOB_TIMEOUT_S = 240.0
SERVE_START_S = 180.0
"""A cold start (Ray, then the embedded cluster) on a 2-core machine shared with other work."""
SERVE_EXIT_S = 60.0
STEADY_MARGIN = "4"
"""``HETSCHED_PACING_MARGIN`` of the tests' services on the bundled local-sim cluster: the
level the live probe picks for its 4 simulated devices on 2 idle cores
(:func:`workers.devices.contention.margin_for`), held as a steady host holds it. A probe
that catches another process starting or exiting picks the next level, and a cached
profile is then read with its times scaled to it; held, every service and app of a session
reads the one profile the first measured, with the same figures.
tests/workers/test_busy_host.py covers the live margin."""


# --- clusters and plans -------------------------------------------------------------------


def make_cluster(types: Sequence[str], *, memory_scale: float = 0.01, name: str = "t") -> Cluster:
    """One node ``a`` with one simulated device per type, ``a/0``, ``a/1``, ... in order."""
    return parse_cluster(
        {
            "name": name,
            "nodes": [{"name": "a", "devices": [{"type": t} for t in types]}],
            "simulation": {"memory_scale": memory_scale},
        }
    )


def one_line_error(error: type[Exception], parse: Callable[[Any], object], data: Any) -> str:
    """The message ``parse(data)`` raises ``error`` with, checked to be one line."""
    with pytest.raises(error) as info:
        parse(data)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


def spec_error(data: Any) -> str:
    """The one-line error a bad cluster spec gets."""
    return one_line_error(SpecError, parse_cluster, data)


def unit_device(device_id: str, **changes: Any) -> DeviceProfile:
    """A device of type X that needs no memory and takes one second a sample; ``changes``
    set any other field. Its node is the id's part before the slash."""
    values: dict[str, Any] = {
        "id": device_id,
        "node": device_id.split("/")[0],
        "type": "X",
        "capacity_bytes": 1,
        "static_bytes": 0,
        "per_sample_bytes": 0,
        "fixed_s": 0.0,
        "per_sample_s": 1.0,
    }
    values.update(changes)
    return DeviceProfile(**values)


def plan_of(strategy: str, devices: Sequence[DevicePlan]) -> Plan:
    """A plan over hand-written device entries; its global batch is what the first stage
    of every pipeline (or, data parallel, every device) computes. Predictions are dummies."""
    global_batch = sum(d.samples for d in devices if not d.stage)
    return Plan(
        strategy=strategy,
        global_batch=global_batch,
        predicted_step_s=0.5,
        compute_s=0.5,
        comm_s=0.0,
        devices=tuple(devices),
    )


def manual_plan(
    split: Sequence[tuple[str, int, int] | tuple[str, int, int, float]],
    *,
    strategy: str = "dp",
    shard_groups: Sequence[int] | None = None,
) -> Plan:
    """A data-parallel plan from ``(device id, samples, micro_batch)`` triples, in batch
    order; each device runs as many micro-batches of at most ``micro_batch`` as it needs.

    A fourth element is the device's ``shard`` (fully sharded plans: ``strategy="fsdp"``),
    and ``shard_groups`` gives each device its sharding group (HSDP)."""
    devices, offset = [], 0
    for i, (device_id, samples, micro_batch, *shard) in enumerate(split):
        devices.append(
            DevicePlan(
                id=device_id,
                samples=samples,
                micro_batch=micro_batch,
                accum_steps=-(-samples // micro_batch) if samples else 0,
                busy_s=0.0,
                peak_bytes=0,
                offset=offset,
                shard=shard[0] if shard else None,
                shard_group=shard_groups[i] if shard_groups is not None else None,
            )
        )
        offset += samples
    return plan_of(strategy, devices)


def pipeline_stage(
    device_id: str,
    *,
    samples: int,
    offset: int = 0,
    num_micro_batches: int,
    layers: tuple[int, int],
    stage: int,
    pipeline: int = 0,
) -> DevicePlan:
    """One stage of a pipeline that cuts its ``samples`` into ``num_micro_batches``."""
    return DevicePlan(
        id=device_id,
        samples=samples,
        micro_batch=-(-samples // num_micro_batches),
        accum_steps=num_micro_batches,
        busy_s=0.0,
        peak_bytes=0,
        offset=offset,
        layers=layers,
        stage=stage,
        pipeline=pipeline,
    )


# --- jobs ----------------------------------------------------------------------------------


class Getter(Protocol):
    """What polls a job: FastAPI's ``TestClient`` or an ``httpx.Client(base_url=...)``."""

    def get(self, url: str, **kwargs: Any) -> httpx.Response: ...


def wait_for(
    client: Getter,
    job_id: str,
    done: Callable[[dict[str, Any]], bool],
    timeout_s: float = JOB_TIMEOUT_S,
) -> dict[str, Any]:
    """Poll the job until ``done(job)``; fail at once if it ended without getting there."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"{JOBS}/{job_id}").json()
        if done(job):
            return job
        if job["state"] in TERMINAL:
            pytest.fail(f"job {job_id} ended {job['state']} first: {job['message']}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s; job is {job['state']}: {job}")
        time.sleep(0.1)


# --- hetsched serve, as a user runs it ------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on now (the OS's pick; another process may take it later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the caller's ``HETSCHED_*`` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETSCHED_")}
    return env | extra


def steady_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    """:func:`clean_env` for a ``hetsched serve`` that shares the session's profile cache
    and holds :data:`STEADY_MARGIN`."""
    return clean_env(
        HETSCHED_CACHE_DIR=str(cache_dir), HETSCHED_PACING_MARGIN=STEADY_MARGIN, **extra
    )


def serve_command(data_dir: Path, *args: str) -> list[str]:
    """The command line of ``hetsched serve`` on ``data_dir``, as a user types it."""
    return [sys.executable, "-m", "api.cli", "serve", "--data-dir", str(data_dir), *args]


class Serve:
    """One ``hetsched serve`` subprocess on a free port of 127.0.0.1, its output in ``log``.

    It runs in a session of its own, so a signal meant for pytest does not reach it and
    :meth:`stop` can end what it left behind by process group.
    """

    def __init__(self, data_dir: Path, *args: str, env: Mapping[str, str] | None = None) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir / "serve.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                serve_command(data_dir, "--port", str(self.port), *args),
                cwd=REPO,
                env=dict(env) if env is not None else clean_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def tail(self, lines: int = 30) -> str:
        """The end of what it said, for a failure's message."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_up(self, *, timeout_s: float = SERVE_START_S) -> dict[str, Any]:
        """Wait until ``/healthz`` says the cluster is available; its answer."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"hetsched serve exited with {self.process.returncode}:\n{self.tail()}")
            with suppress(httpx.HTTPError, ValueError, KeyError):
                health = httpx.get(f"{self.url}/healthz", timeout=2).json()
                if health["cluster"] == "available":
                    return health
            if time.monotonic() > deadline:
                pytest.fail(f"hetsched serve not up in {timeout_s:.0f} s:\n{self.tail()}")
            time.sleep(0.5)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)

    def stop(self, *, timeout_s: float = SERVE_EXIT_S) -> int:
        """SIGTERM, as systemd or a container runtime stops it (the lifespan shutdown ends
        the executor and Ray), and wait; past ``timeout_s``, kill its process group.
        Its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode


@contextmanager
def serving(data_dir: Path, *args: str, env: Mapping[str, str] | None = None) -> Iterator[Serve]:
    """A started ``hetsched serve`` whose cluster is up, stopped with SIGTERM afterwards."""
    service = Serve(data_dir, *args, env=env)
    try:
        service.wait_up()
        yield service
    finally:
        service.stop()


@contextmanager
def uvicorn_thread(app: Any, *, start_s: float = SERVE_START_S) -> Iterator[str]:
    """``app`` served by uvicorn on a free port of 127.0.0.1 in a thread of this process,
    its lifespan run (so it shares this process's Ray); yields its URL. For tests of
    commands that reach a service over HTTP."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(SERVE_EXIT_S)


# --- one local Ray for consecutive modules ---------------------------------------------------


class SharedRay:
    """One local Ray (2 CPUs, no dashboard) and the warm worker pools built on it, shared by
    consecutive test modules that ask for the same simulated devices.

    Starting Ray and then a pool's workers (each imports torch) costs 5-7 s of a 2-core
    machine; a module that asks for them gets the ones the module before it left running.
    Asking with other devices, or after something else stopped or replaced this Ray, starts
    a fresh one. ``tests/conftest.py`` stops it before a module that does not ask for it,
    whose product code may start a Ray of its own, and at the end of the session.
    """

    def __init__(self) -> None:
        self.devices: tuple[str, ...] | None = None
        self.address: str | None = None
        self.kept: dict[str, tuple[Any, Callable[[Any], None]]] = {}

    def ensure(self, cluster: Cluster) -> None:
        """A running local Ray whose custom resources name ``cluster``'s devices."""
        import ray

        from workers.session import start_local_ray

        devices, address = tuple(cluster.ids), _gcs_address()
        if address is not None and (self.devices, self.address) == (devices, address):
            return
        self.stop()
        if ray.is_initialized():  # a Ray some product code started and left
            ray.shutdown()
        start_local_ray(cluster, num_cpus=2)
        self.devices, self.address = devices, _gcs_address()

    def keep(self, name: str, make: Callable[[], Any], close: Callable[[Any], None]) -> Any:
        """What ``make`` built under ``name`` on this Ray (a pool, a cluster handle), built
        once; ``close`` ends it when this Ray stops."""
        if name not in self.kept:
            self.kept[name] = (make(), close)
        return self.kept[name][0]

    def stop(self) -> None:
        """End what was kept, then the Ray if one is running."""
        kept, self.kept = self.kept, {}
        for thing, close in kept.values():
            with suppress(Exception):  # its workers may be gone with a Ray someone else stopped
                close(thing)
        if self.devices is not None or kept:
            import ray

            ray.shutdown()
        self.devices = self.address = None


def _gcs_address() -> str | None:
    import ray

    return ray.get_runtime_context().gcs_address if ray.is_initialized() else None


SHARED_RAY = SharedRay()


MIXED_CLUSTER = make_cluster(["A100-80GB", "T4-16GB", "L4-24GB"])
"""An A100, a T4 and an L4 (``a/0``, ``a/1``, ``a/2``): what tests/workers' ``mixed_pool``
holds, so a run on that pool names the same cluster."""


def tiny_job(cluster: Cluster, cache_dir: Path, *, steps: int, seed: int, **more: Any) -> TrainJob:
    """gpt-tiny on ``cluster`` for ``steps`` steps from ``seed``, paced by the calibration
    under ``cache_dir``; ``more`` sets the job's other fields (optimizer, dtype, dataset)."""
    return TrainJob(
        cluster=cluster, model=TINY, steps=steps, seed=seed, cache_dir=cache_dir, **more
    )
