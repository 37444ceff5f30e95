"""A regular install (a wheel, ``pip install .``) carries the bundled cluster specs.

``hetsched serve`` and ``simulate`` read the default spec, and ``--cluster NAME`` a bundled
one, through :mod:`api.core.clusters`; they used to look in the source tree
(``deploy/clusters/``), which a wheel does not have.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from api.core.settings import DEFAULT_CLUSTER

ROOT = Path(__file__).resolve().parents[2]

LOAD_EVERY_SPEC = """
import api
from importlib.resources import files
from api.core.clusters import bundled_cluster, cluster_argument
from api.core.settings import DEFAULT_CLUSTER
from scheduler.hardware.cluster import load_cluster
names = sorted(p.name for p in (files("api") / "clusters").iterdir() if p.name.endswith(".yaml"))
print(api.__file__)
print(load_cluster(DEFAULT_CLUSTER).name, *(load_cluster(bundled_cluster(n)).name for n in names))
print(load_cluster(cluster_argument("cephalo-mix")).name)
"""


def test_the_wheel_carries_every_cluster_spec(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("api", "scheduler", "workers"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("hetsched-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(n).name for n in archive.namelist() if n.startswith("api/clusters/")}
        archive.extractall(site)  # what installing a pure-Python wheel amounts to
    in_checkout = {p.name for p in (ROOT / "deploy" / "clusters").glob("*.yaml")}
    assert DEFAULT_CLUSTER.name in shipped and shipped == in_checkout
    run = subprocess.run(
        [sys.executable, "-c", LOAD_EVERY_SPEC],
        cwd=tmp_path,  # not the checkout, which would shadow the install
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    where, names, by_name = run.stdout.splitlines()
    assert Path(where).is_relative_to(site)  # the installed copy answered, not the checkout
    assert names.split()[0] == "local-sim" and len(names.split()) == len(shipped) + 1
    assert by_name == "cephalo-mix"  # --cluster NAME, from outside any checkout
