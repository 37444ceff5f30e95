"""Fixtures of the API tests: an app per test over a temporary database.

``offline`` apps neither start Ray nor run the executor (fast, for input
handling); ``live`` apps run the executor on one local Ray per module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.cli import main
from api.core.settings import DEFAULT_CLUSTER, Settings
from scheduler.hardware.cluster import load_cluster


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
def local_ray() -> Iterator[None]:
    """One local Ray for a module's live apps, with the bundled local-sim cluster's devices
    (2 CPUs); shut down after the module."""
    import ray

    from workers.session import start_local_ray

    start_local_ray(load_cluster(DEFAULT_CLUSTER), num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture
def live(local_ray: None, cache_dir: Path, tmp_path: Path) -> Callable[..., TestClient]:
    """Build a client over an app whose executor runs on the module's local Ray, with the
    session's profile cache and the ``fifo`` policy unless ``policy=`` says otherwise;
    the caller enters it with ``with`` (and may build a second over the same database)."""

    def build(**overrides: Any) -> TestClient:
        values = {"cache_dir": cache_dir, "policy": "fifo", **overrides}
        return TestClient(create_app(make_settings(tmp_path, **values)))

    return build
