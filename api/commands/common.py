"""What several subcommands share: how a command is registered (with its help from
:data:`api.commands.COMMANDS`), and the arguments that mean the same in each (the
cluster spec, the model, the profile cache, the service's data directory).

Only ``scheduler/``, the command table and :mod:`api.core.clusters` are imported, so
``hetsched plan`` stays free of torch and ray.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.commands import COMMANDS
from api.core.clusters import bundled_cluster_names, cluster_argument
from scheduler.errors import HetschedError
from scheduler.models.presets import PRESETS

Runner = Callable[[argparse.Namespace], int]


def add_command(subparsers: Any, name: str, run: Runner | None = None) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, with its help from :data:`api.commands.COMMANDS`;
    ``hetsched NAME`` runs ``run(args)`` (None: each of its verbs sets its own)."""
    command = COMMANDS[name]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=command.help, description=command.description
    )
    if run is not None:
        parser.set_defaults(run=run)
    return parser


def add_cluster_argument(
    parser: argparse.ArgumentParser, more: str = "", *, default: Path | None = None
) -> None:
    """``--cluster FILE``, a cluster spec (DESIGN.md's "Cluster spec") or a bundled
    example's name; ``more`` ends its help."""
    parser.add_argument(
        "--cluster", metavar="FILE", type=cluster_argument, default=default, help=cluster_help(more)
    )


def cluster_help(more: str = "") -> str:
    """``--cluster``'s help: a spec file or a bundled example, then ``more``."""
    return f"cluster spec (YAML), or a bundled one: {', '.join(bundled_cluster_names())}{more}"


def add_data_dir_argument(parser: argparse.ArgumentParser, *, help: str) -> None:
    """``--data-dir DIR``, the service's data directory (``HETSCHED_DATA_DIR``); ``help``
    says what the command finds there."""
    parser.add_argument("--data-dir", type=Path, metavar="DIR", help=help)


def model_help(lead: str) -> str:
    """``--model``'s help: ``lead``, then what a model may be."""
    return f"{lead}: {', '.join(PRESETS)}; or a Hugging Face config.json or model directory"


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cache-dir`` and ``--refresh``, for commands that profile devices."""
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="profile and calibration cache (default ~/.cache/hetsched)",
    )
    parser.add_argument("--refresh", action="store_true", help="measure again, ignore the cache")


def check_output(flag: str, path: Path, *, suffixes: tuple[str, ...] = ()) -> None:
    """A one-line error before any work when ``path`` cannot be written as a file: a
    folder, a folder that does not exist, or (``suffixes``) an extension not allowed."""
    if path.is_dir():
        raise HetschedError(f"{flag}: {path} is a folder; give a file name")
    if not path.parent.is_dir():  # a bare file name's parent is "."
        raise HetschedError(f"{flag}: folder {path.parent} does not exist")
    if suffixes and path.suffix.lower() not in suffixes:
        raise HetschedError(
            f"{flag}: {path.name} must end in {', '.join(suffixes)}, got {path.suffix or 'none'}"
        )


def write_text(flag: str, path: Path, text: str) -> None:
    """``path.write_text(text)``, a one-line error naming ``flag`` when it cannot be."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise HetschedError(f"{flag}: cannot write {path}: {exc.strerror or exc}") from None
