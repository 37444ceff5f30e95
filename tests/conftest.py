"""Fixtures every test directory shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Profiles and host calibrations, shared by every test of the session: a device
    measured once is not measured again (the profiler's cache is what users get too)."""
    return tmp_path_factory.mktemp("hetsched-cache")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread, as workers use: on a shared 2-core machine more threads
    contend and a tiny model's step gets about ten times slower."""
    import torch  # here, not at the top: the scheduler tests run without torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
