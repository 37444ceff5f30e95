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

from api.commands import COMMANDS
from scheduler.errors import HetschedError


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
    """The parser; only ``command``'s module is imported when it is a known command
    (the others, and every one for ``hetsched --help``, are listed from :data:`COMMANDS`)."""
    parser = OneLineParser(
        prog="hetsched",
        description="Train one transformer across mixed GPUs with uneven per-device batches.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    needed = COMMANDS[command].module if command in COMMANDS else None
    for name, entry in COMMANDS.items():
        if entry.module != needed:
            sub.add_parser(name, help=entry.help)  # listed in usage; never parsed in this run
        elif name not in sub.choices:  # the module registers all of its commands at once
            importlib.import_module(f"api.commands.{entry.module}").add_parser(sub)
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
