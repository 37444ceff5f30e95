"""Fixtures of the API tests: an app per test over a temporary database.

``offline`` apps neither start Ray nor run the executor (fast, for input
handling); the lifecycle module starts one local Ray for all of its apps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.core.settings import Settings


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings that ignore the caller's HETSCHED_* environment."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "api_token": None,
        "db_url": None,
        "cluster": None,
        "ray_address": None,
        "ray_num_cpus": 2,
    }
    values.update(overrides)
    return Settings(**values)


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
