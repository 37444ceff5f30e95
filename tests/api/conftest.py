"""Fixtures of the API tests: an app per test over a temporary database.

``offline`` apps neither start Ray nor run the executor (fast, for input
handling); ``live`` apps run the executor on one local Ray per module.
``db_url`` is a fresh database on SQLite and on a throwaway PostgreSQL server.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from api.app import create_app
from api.cli import main
from api.core.settings import DEFAULT_CLUSTER, Settings
from api.schemas.jobs import JobPublic
from api.services import ClusterHandle, connect_cluster
from hetsched import Client, Event
from scheduler.hardware.cluster import load_cluster
from tests.support import (
    JOB_TIMEOUT_S,
    SHARED_RAY,
    STEADY_MARGIN,
    Serve,
    free_port,
    serving,
    steady_env,
)


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings that ignore the caller's HETSCHED_* environment."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "api_token": None,
        "db_url": None,
        "cluster": None,
        "ray_address": None,
        "ray_num_cpus": 2,
        "allowed_hosts": ["testserver"],  # the Host header of Starlette's TestClient
    }
    values.update(overrides)
    return Settings(**values)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``hetsched ARGV...`` in this process: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def settings_factory() -> Callable[..., Settings]:
    return make_settings


@pytest.fixture
def offline_settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, start_ray=False, executor=False)


@pytest.fixture
def offline(offline_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(offline_settings)) as client:
        yield client


@pytest.fixture
def app_client(tmp_path: Path) -> Callable[..., TestClient]:
    """Build a client over a fresh app; the caller enters it with ``with``."""

    def build(**overrides: Any) -> TestClient:
        settings = make_settings(tmp_path, **{"start_ray": False, "executor": False, **overrides})
        return TestClient(create_app(settings))

    return build


@pytest.fixture(scope="module")
def local_ray() -> None:
    """A local Ray (2 CPUs) naming the bundled local-sim cluster's devices, for a module's
    live apps; left running for the next module that asks (:class:`tests.support.SharedRay`)."""
    SHARED_RAY.ensure(load_cluster(DEFAULT_CLUSTER))


@pytest.fixture(scope="module")
def warm_cluster(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> ClusterHandle:
    """The cluster handle with its warm device workers, shared by the live apps of this
    module and the ones after it, as a service's one handle is shared by its jobs: each app
    would otherwise start four worker processes of its own. A device a test took out of
    service is back for the next module, and for the next test (:func:`live`)."""

    def connect() -> ClusterHandle:
        handle = connect_cluster(make_settings(tmp_path_factory.mktemp("cluster")))
        assert handle.available and handle.local_ray is None, handle.message
        handle.warm()
        return handle

    handle = SHARED_RAY.keep("warm_cluster", connect, lambda handle: handle.close())
    handle.pool.mark_lost(handle.cluster.ids, lost=False)  # what a module before took out
    return handle


@pytest.fixture(scope="module")
def steady_margin() -> Iterator[None]:
    """:data:`~tests.support.STEADY_MARGIN` for the module's apps in this process, as the
    services the tests start hold it: the session's profile cache is then read, not
    measured again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HETSCHED_PACING_MARGIN", STEADY_MARGIN)
        yield


@pytest.fixture
def live(
    warm_cluster: ClusterHandle, cache_dir: Path, tmp_path: Path, steady_margin: None
) -> Callable[..., TestClient]:
    """Build a client over an app whose executor runs on the module's local Ray and warm
    workers, with the session's profile cache, :data:`~tests.support.STEADY_MARGIN` and
    the ``fifo`` policy unless ``policy=`` says otherwise; the caller enters it with
    ``with`` (and may build a second over the same database)."""
    warm_cluster.pool.mark_lost(warm_cluster.cluster.ids, lost=False)

    def build(**overrides: Any) -> TestClient:
        values = {"cache_dir": cache_dir, "policy": "fifo", **overrides}
        return TestClient(create_app(make_settings(tmp_path, **values), cluster=warm_cluster))

    return build


class ThreadedService:
    """An app under uvicorn in a thread of this process, on ``port`` (default a free one);
    :meth:`start` may wait first, as a service that comes up late."""

    def __init__(self, settings: Settings, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    def start(self, *, delay_s: float = 0.0) -> ThreadedService:
        def serve() -> None:
            time.sleep(delay_s)
            self.server.run()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        return self

    def wait_up(self, timeout_s: float = 30.0) -> ThreadedService:
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)


SERVICE_TOKEN = "tok"
"""The bearer token of :func:`live_service`."""


@pytest.fixture(scope="session")
def live_service(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Serve]:
    """One ``hetsched serve`` (its own process and local Ray, the fifo policy, token
    :data:`SERVICE_TOKEN`, the session's profile cache and
    :data:`~tests.support.STEADY_MARGIN`) shared by the client's and the CLI's tests."""
    env = steady_env(cache_dir, HETSCHED_API_TOKEN=SERVICE_TOKEN, HETSCHED_POLICY="fifo")
    with serving(tmp_path_factory.mktemp("service"), env=env) as service:
        yield service


@dataclass(frozen=True, kw_only=True, slots=True)
class Trained:
    """A job :func:`trained_job` ran to the end, and what following it live yielded."""

    job: JobPublic
    events: list[Event]


TRAINED_STEPS = 4


@pytest.fixture(scope="session")
def trained_job(live_service: Serve) -> Trained:
    """A short job on :func:`live_service`, followed live from its submission to its end
    (checkpoints and validation after steps 1 and 3)."""
    with Client(live_service.url, token=SERVICE_TOKEN) as client:
        job = client.submit(
            name="trained", global_batch=8, steps=TRAINED_STEPS, checkpoint_every=2, val_every=2
        )
        events = list(client.follow(job.id, poll_s=0.2))
        return Trained(job=client.wait(job.id, timeout_s=JOB_TIMEOUT_S), events=events)


# --- PostgreSQL -----------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Where PostgreSQL's initdb and pg_ctl are: on the PATH, or Debian's versioned folder."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    return versions[-1].parent if versions else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL server for the session, on a free port of 127.0.0.1 with
    ``trust`` authentication; its SQLAlchemy URL without a database name.

    PostgreSQL refuses to run as root: as root it runs as the ``postgres`` system user
    (Debian's package makes one), its data directory handed over to that user.
    """
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="hetsched-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("PostgreSQL is installed but there is no 'postgres' user to run it as")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()

    def pg(*argv: str) -> None:
        done = subprocess.run([*as_user, *argv], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            pytest.fail(f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr[-2000:]}")

    pg(str(bindir / "initdb"), "-D", str(data), "-U", "hetsched", "--auth=trust", "--no-sync")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg(
        str(bindir / "pg_ctl"),
        "-D",
        str(data),
        "-o",
        options,
        "-l",
        str(root / "log"),
        "-w",
        "start",
    )
    try:
        yield f"postgresql+psycopg://hetsched@127.0.0.1:{port}"
    finally:
        pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database on the session's PostgreSQL server, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{postgres_server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{postgres_server}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The job store's database, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hetsched.db'}"
    return str(request.getfixturevalue("postgres_url"))
