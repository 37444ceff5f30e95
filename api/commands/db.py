"""``hetsched db``: the job store's schema, for operators.

    hetsched db current                 the database's revision, and the newest there is
    hetsched db upgrade [REV]           to REV (default: the newest), as ``serve`` does on start
    hetsched db downgrade [REV]         back to REV (default: one revision back)

The database is the service's: ``--db URL`` or ``HETSCHED_DB_URL`` (SQLite, or PostgreSQL
with the ``postgres`` extra: ``postgresql+psycopg://user:pass@host/db``), else the SQLite
file in ``--data-dir`` / ``HETSCHED_DATA_DIR``. Stop the service before a downgrade.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from alembic.util import CommandError
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError

from api.commands.common import add_command, add_data_dir_argument
from api.core.migrate import current_revision, downgrade, head_revision, revisions, upgrade
from api.core.settings import Settings
from scheduler.errors import HetschedError


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "db", run)
    parser.add_argument("action", choices=("current", "upgrade", "downgrade"))
    parser.add_argument(
        "revision",
        nargs="?",
        metavar="REV",
        help="upgrade: default head; downgrade: default -1 (one back), or 'base' (empty)",
    )
    parser.add_argument("--db", metavar="URL", help="SQLAlchemy URL (default HETSCHED_DB_URL)")
    add_data_dir_argument(parser, help="where the SQLite file is (default ./.hetsched)")


def database_url(args: argparse.Namespace) -> str:
    overrides = {"db_url": args.db, "data_dir": args.data_dir}
    return Settings(**{k: v for k, v in overrides.items() if v is not None}).database_url


def _describe(revision: str | None) -> str:
    if revision is None:
        return "empty (no hetsched tables)"
    head = head_revision()
    return f"{revision} (head)" if revision == head else f"{revision} (head is {head})"


def _check_revision(action: str, revision: str) -> None:
    known = revisions()
    if revision in ("head", "base") or revision in known:
        return
    if action == "downgrade" and revision.startswith("-") and revision[1:].isdigit():
        return
    steps = ", -N" if action == "downgrade" else ""
    raise HetschedError(
        f"REV: unknown revision {revision!r}; known: {', '.join(known)}, head, base{steps}"
    )


def _act(engine: Engine, action: str, revision: str | None) -> str:
    before = current_revision(engine)
    if action == "current":
        return f"database: {_describe(before)}"
    if action == "upgrade":
        target = revision or "head"
        _check_revision(action, target)
        return f"upgraded from {_describe(before)} to {_describe(upgrade(engine, target))}"
    target = revision or "-1"
    _check_revision(action, target)
    if before is None:
        raise HetschedError("downgrade: the database has no hetsched tables; nothing to undo")
    return f"downgraded from {_describe(before)} to {_describe(downgrade(engine, target))}"


def _engine(url: str, action: str) -> Engine:
    """An engine that does not migrate on connecting (as make_engine does). A SQLite file
    is made only by an upgrade; reading or downgrading a missing one is an error."""
    engine = create_engine(url)
    path = engine.url.database
    if engine.url.get_backend_name() == "sqlite" and path and path != ":memory:":
        if action == "upgrade":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        elif not Path(path).is_file():
            raise HetschedError(f"db: no database at {path}; give --db or --data-dir")
    return engine


def run(args: argparse.Namespace) -> int:
    engine = _engine(database_url(args), args.action)
    try:
        print(_act(engine, args.action, args.revision))
    except CommandError as exc:  # Alembic's one-line refusals (a revision out of range)
        raise HetschedError(f"db {args.action}: {exc}") from None
    except SQLAlchemyError as exc:
        cause = getattr(exc, "orig", None) or exc  # the driver's own error, when there is one
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise HetschedError(f"db: cannot use {engine.url.render_as_string()}: {first}") from None
    finally:
        engine.dispose()
    return 0
