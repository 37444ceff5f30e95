"""Subcommands of the ``hetsched`` command line, one module each.

Each command module defines ``add_parser(subparsers)`` and ``run(args) -> int``;
:mod:`api.commands.common` holds what several share. They are imported only when
their command runs, so ``hetsched plan`` never pays for importing torch or ray.
"""
