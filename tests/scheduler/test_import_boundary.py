"""The rooms and their packages point one way: no import goes up a layer, none goes around.

``scheduler/`` stays pure (importing all of it pulls in neither torch, ray nor
fastapi), ``workers/`` never imports ``api/``, and inside each room a package
imports only the packages below it in :data:`LAYERS`, so the tree reads as the
architecture: each package's ``__init__`` docstring says the same in words.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: dict[str, list[set[str]]] = {
    "scheduler": [
        {"errors", "units"},
        {"hardware", "models"},
        {"cost"},
        {"planning", "policy"},
        {"replan", "clustersim"},
    ],
    "workers": [
        {"errors", "records"},
        {"checkpoint", "data", "models"},
        {"devices"},
        {"runtime"},
        {"cluster"},
        {"profiler", "run"},
        {"session"},
    ],
    "api": [
        {"states", "contract"},
        {"core", "schemas"},
        {"accounts"},
        {"store", "migrations"},
        {"services"},
        {"execution"},
        {"views", "deps"},
        {"routes"},
        {"app", "client"},
        {"commands"},
        {"cli"},
    ],
}
"""Each room's packages and top-level modules, lowest first: a part imports only lower rows."""

ROOMS = ("scheduler", "workers", "api")


def _part(module: str) -> tuple[str, str] | None:
    """``workers.run.driver`` -> ``("workers", "run")``; None outside the three rooms."""
    parts = module.split(".")
    if parts[0] not in ROOMS or len(parts) < 2:
        return None
    return parts[0], parts[1]


def _imports() -> list[tuple[str, tuple[str, str], tuple[str, str]]]:
    """(file, importing part, imported part) for every absolute import between parts."""
    found = []
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            relative = path.relative_to(ROOT)
            source = _part(".".join(relative.with_suffix("").parts))
            if source is None:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [node.module]
                elif isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                else:
                    continue
                for target in targets:
                    part = _part(target)
                    if part is not None and part != source:
                        found.append((str(relative), source, part))
    return found


def _rank(part: tuple[str, str]) -> int:
    room, name = part
    for rank, row in enumerate(LAYERS[room]):
        if name in row:
            return rank
    raise AssertionError(f"{room}/{name} is in no row of LAYERS: add it where it belongs")


def test_every_part_of_every_room_has_a_layer() -> None:
    for room in ROOMS:
        for entry in (ROOT / room).iterdir():
            if entry.name.startswith("__") or entry.name in {"static", "corpus"}:
                continue
            if entry.suffix == ".py" or (entry / "__init__.py").exists():
                _rank((room, entry.stem))


def test_imports_point_down_the_layers_and_never_up_a_room() -> None:
    room_order = {room: i for i, room in enumerate(ROOMS)}
    wrong = []
    for path, source, target in _imports():
        if source[0] != target[0]:
            if room_order[target[0]] > room_order[source[0]]:
                wrong.append(f"{path}: {'.'.join(source)} imports {'.'.join(target)} (a room up)")
        elif _rank(target) >= _rank(source):
            wrong.append(f"{path}: {'.'.join(source)} imports {'.'.join(target)} (not below it)")
    assert wrong == [], "\n".join(wrong)


PROBE = """
import importlib, json, pkgutil, sys
import {room}
names = sorted(m.name for m in pkgutil.walk_packages({room}.__path__, "{room}."))
for name in names:
    importlib.import_module(name)
print(json.dumps({{"modules": names, "loaded": sorted(sys.modules)}}))
"""


def _probe(room: str) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(room=room)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_scheduler_imports_no_torch_ray_or_fastapi() -> None:
    report = _probe("scheduler")
    assert {"scheduler.planning.planner", "scheduler.policy.decide"} <= set(report["modules"])
    heavy = [m for m in ("torch", "ray", "fastapi") if m in report["loaded"]]
    assert heavy == [], f"scheduler imported {heavy}"


def test_workers_import_nothing_of_the_api() -> None:
    report = _probe("workers")
    assert {"workers.run.driver", "workers.runtime.worker"} <= set(report["modules"])
    outside = [m for m in report["loaded"] if m == "api" or m.startswith("api.")]
    assert outside == [], f"workers imported {outside}"
