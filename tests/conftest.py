"""Fixtures every test directory shares."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Profiles and host calibrations, shared by every test of the session: a device
    measured once is not measured again (the profiler's cache is what users get too)."""
    return tmp_path_factory.mktemp("hetsched-cache")
