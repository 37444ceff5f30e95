"""Fixtures every test directory shares."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import SHARED_RAY


def _asks_for_local_ray(item: pytest.Item) -> bool:
    return "local_ray" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each directory, the modules that ask for ``local_ray`` run last, one after
    another, each in its own order: they then share one Ray and its warm pools
    (:class:`tests.support.SharedRay`) instead of starting them again after every module
    in between that stops it. Directories keep their order, as do modules within each group."""
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    directories = list(dict.fromkeys(path.parent for path in modules))
    asks = {path: any(map(_asks_for_local_ray, its)) for path, its in modules.items()}
    order = sorted(modules, key=lambda path: (directories.index(path.parent), asks[path]))
    items[:] = [item for path in order for item in modules[path]]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Profiles and host calibrations, shared by every test of the session: a device
    measured once is not measured again (the profiler's cache is what users get too)."""
    return tmp_path_factory.mktemp("hetsched-cache")


@pytest.fixture(scope="session", autouse=True)
def _shared_ray_stops_at_the_end() -> Iterator[None]:
    yield
    SHARED_RAY.stop()


@pytest.fixture(scope="module", autouse=True)
def _no_shared_ray_unless_asked(request: pytest.FixtureRequest) -> None:
    """A module none of whose tests asks for ``local_ray`` starts with the shared Ray
    stopped, as it would after a module that had its own: the product code it runs may
    start a Ray of its own, with its own devices."""
    items = (i for i in request.session.items if getattr(i, "module", None) is request.module)
    if not any("local_ray" in item.fixturenames for item in items):
        SHARED_RAY.stop()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread in this process for every test that has torch loaded, as workers
    use: on a shared 2-core machine more threads contend, and a tiny model's step gets
    three to ten times slower (the README demo's 50 steps: 21 s against 62 s)."""
    torch = sys.modules.get("torch")  # not imported here: the scheduler tests run without it
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
