"""``scheduler/`` stays pure: importing all of it pulls in neither torch, ray nor fastapi."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import scheduler

PROBE = """
import importlib, json, pkgutil, sys
import scheduler
names = sorted(m.name for m in pkgutil.iter_modules(scheduler.__path__))
for name in names:
    importlib.import_module("scheduler." + name)
heavy = [m for m in ("torch", "ray", "fastapi") if m in sys.modules]
print(json.dumps({"modules": names, "heavy": heavy}))
"""


def test_scheduler_imports_no_torch_ray_or_fastapi() -> None:
    root = Path(scheduler.__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    expected = {"catalogue", "cluster", "costmodel", "errors", "models", "plan", "planner"}
    assert expected <= set(report["modules"]), "the probe imported the whole package"
    assert report["heavy"] == [], f"scheduler imported {report['heavy']}"


WORKERS_PROBE = """
import importlib, json, pkgutil, sys
import workers
names = sorted(m.name for m in pkgutil.iter_modules(workers.__path__))
for name in names:
    importlib.import_module("workers." + name)
outside = sorted(m for m in sys.modules if m == "api" or m.startswith("api."))
print(json.dumps({"modules": names, "outside": outside}))
"""


def test_workers_import_nothing_of_the_api() -> None:
    """The rooms point one way: api/ uses workers/, workers/ never uses api/."""
    root = Path(scheduler.__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", WORKERS_PROBE],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"driver", "engine", "pool", "worker"} <= set(report["modules"])
    assert report["outside"] == [], f"workers imported {report['outside']}"
