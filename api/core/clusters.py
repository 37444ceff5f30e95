"""The example cluster specs shipped inside the package (``api/clusters/``, linked from
``deploy/clusters/`` in a checkout), found by :mod:`importlib.resources` so that a wheel or a
non-editable install has them too; ``--cluster cephalo-mix`` names one from any directory."""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path


def bundled_cluster(name: str) -> Path:
    """The bundled spec file ``name`` (``local-sim.yaml``)."""
    return Path(str(files("api") / "clusters" / name))


def bundled_cluster_names() -> list[str]:
    """The bundled specs' names, without ``.yaml``, sorted."""
    return sorted(p.stem for p in bundled_cluster(".").glob("*.yaml"))


def cluster_argument(value: str) -> Path:
    """``--cluster``'s value: the spec file it names or, when there is no such file and it
    names no directory, the bundled spec of that name (``cephalo-mix`` or
    ``cephalo-mix.yaml``). A bare name that is neither is refused with the bundled names;
    any other path is returned as given, for the loader to say what it cannot read."""
    path = Path(value)
    if path.exists() or path.name != value:
        return path
    for name in (value, f"{value}.yaml"):
        if (bundled := bundled_cluster(name)).is_file():
            return bundled
    if not path.suffix:
        raise argparse.ArgumentTypeError(
            f"no file {value!r} and no bundled spec of that name; bundled: "
            + ", ".join(bundled_cluster_names())
        )
    return path
