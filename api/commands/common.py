"""What several subcommands share: how a command is registered, and the arguments
that mean the same in each (the model, the profile cache).

Only ``scheduler/`` is imported, so ``hetsched plan`` stays free of torch and ray.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler.models.presets import PRESETS

Runner = Callable[[argparse.Namespace], int]


def add_command(
    subparsers: Any, name: str, run: Runner, *, help: str, description: str
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, which ``hetsched`` runs with ``run(args)``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description
    )
    parser.set_defaults(run=run)
    return parser


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
