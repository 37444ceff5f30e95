"""The ``hetsched`` command line.

    hetsched gpus                       the GPU catalogue
    hetsched plan ...                   plan a split (pure, no cluster needed)
    hetsched profile ...                measure a cluster's devices
    hetsched simulate ...               train on a local simulated mixed cluster
    hetsched cluster-sim ...            replay a job trace under scheduling policies
    hetsched serve ...                  the control plane and dashboard
    hetsched prepare-data ...           tokenize a text file into a token-id dataset
    hetsched export ...                 a checkpoint as a Hugging Face model directory
    hetsched db upgrade|current|downgrade   the job store's schema (operators)
    hetsched submit|jobs|status|logs|wait|stop|delete   a running control plane's jobs
    hetsched cluster|schedule|datasets|upload           its devices, policy and datasets
    hetsched users|projects|audit                       who shares it (admins)

User errors, usage errors included, print one line, ``hetsched: error: ...``, and exit
with code 2; output piped into ``head`` ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

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
    "db": "db",
    "submit": "client",
    "jobs": "client",
    "status": "client",
    "logs": "client",
    "wait": "client",
    "stop": "client",
    "delete": "client",
    "cluster": "remote",
    "schedule": "remote",
    "datasets": "remote",
    "upload": "remote",
    "users": "users",
    "projects": "users",
    "audit": "users",
}


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error (``--help`` still shows usage);
    its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("hetsched").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"hetsched: error: {where}{message} (see {self.prog} --help)\n")


def _command_from_argv(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported when it is a known command."""
    parser = OneLineParser(
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
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the try
        return code
    except HetschedError as exc:
        print(f"hetsched: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `hetsched jobs | head -1`: the reader has gone. Point stdout at /dev/null so the
        # interpreter's last flush cannot complain, and exit as a SIGPIPE'd tool does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
