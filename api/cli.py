"""The ``hetsched`` command line.

    hetsched gpus                       the GPU catalogue
    hetsched plan ...                   plan a split (pure, no cluster needed)
    hetsched profile ...                measure a cluster's devices
    hetsched simulate ...               train on a local simulated mixed cluster
    hetsched cluster-sim ...            replay a job trace under scheduling policies
    hetsched serve ...                  the control plane and dashboard
    hetsched prepare-data ...           tokenize a text file into a token-id dataset
    hetsched export ...                 a checkpoint as a Hugging Face model directory
    hetsched submit|jobs|status|stop    talk to a running control plane
    hetsched users|projects|audit       manage who shares it (admins)

User errors print one line, ``hetsched: error: ...``, and exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from scheduler.errors import HetschedError

# command name -> module under api.commands that implements it
COMMANDS = {
    "gpus": "gpus",
    "plan": "plan",
    "profile": "profile",
    "simulate": "simulate",
    "cluster-sim": "cluster_sim",
    "serve": "serve",
    "prepare-data": "prepare_data",
    "export": "export",
    "submit": "client",
    "jobs": "client",
    "status": "client",
    "stop": "client",
    "users": "users",
    "projects": "users",
    "audit": "users",
}


def _command_from_argv(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported when it is a known command."""
    parser = argparse.ArgumentParser(
        prog="hetsched",
        description="Train one transformer across mixed GPUs with uneven per-device batches.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = list(dict.fromkeys(COMMANDS.values()))
    needed = {COMMANDS[command]} if command in COMMANDS else set(modules)
    for module_name in modules:
        if module_name in needed:
            importlib.import_module(f"api.commands.{module_name}").add_parser(sub)
    for name, module_name in COMMANDS.items():
        if module_name not in needed:
            sub.add_parser(name)  # listed in usage; never parsed in this run
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_from_argv(argv)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except HetschedError as exc:
        print(f"hetsched: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetsched: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
