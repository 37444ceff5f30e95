"""Subcommands of the ``hetsched`` command line, one module each.

Each module defines ``add_parser(subparsers)`` and ``run(args) -> int``. They
are imported only when their command runs, so ``hetsched plan`` never pays
for importing torch or ray.
"""
