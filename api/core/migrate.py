"""Schema migrations of the job store (Alembic), applied when the service starts.

The revisions live in ``api/migrations/versions`` (packaged with ``api``).
On start, :func:`upgrade` brings the database to the newest revision:

- a new database is built by running every revision;
- a database made before migrations existed (the tables of revision 0001,
  no ``alembic_version``) is stamped 0001 first, then upgraded, rows kept.

Operators run the same functions with ``hetsched db upgrade | current | downgrade``
(api/commands/db.py), and ``alembic`` itself works from the repository root
(``[tool.alembic]`` in pyproject.toml; the database is ``HETSCHED_DB_URL`` or the data
directory's SQLite file, as the service reads them).

Adding a table or column (checkpoints, recovery records): change the models
in ``api/core/db.py``, then write the next revision, by hand or with

    .venv/bin/python -m api.core.migrate revision "add checkpoints"

which autogenerates it from the difference between the models and a
database at the current head; tests/api/test_migrations.py fails while the
two disagree.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, inspect

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
BASELINE = "0001"
"""The revision whose tables hetsched made with ``create_all`` before migrations."""


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory.from_config(_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Bring ``engine``'s database to ``revision`` (the newest by default); returns it."""
    with engine.begin() as connection:
        tables = set(inspect(connection).get_table_names())
        config = _config(connection)
        if "jobs" in tables and "alembic_version" not in tables:
            command.stamp(config, BASELINE)  # made by create_all before migrations
        command.upgrade(config, revision)
    return current_revision(engine) or ""


def downgrade(engine: Engine, revision: str) -> str | None:
    """Take ``engine``'s database back to ``revision`` (``-1``: one step; ``base``: empty);
    returns the revision it is at after (None: no tables of hetsched's left)."""
    with engine.begin() as connection:
        command.downgrade(_config(connection), revision)
    return current_revision(engine)


def _autogenerate(message: str) -> None:
    """Write the next revision from the models' difference to a database at head."""
    with tempfile.TemporaryDirectory() as scratch:
        engine = create_engine(f"sqlite:///{scratch}/head.db")
        upgrade(engine)
        with engine.begin() as connection:
            command.revision(
                _config(connection),
                message=message,
                autogenerate=True,
                rev_id=f"{int(head_revision()) + 1:04d}",  # 0002, 0003, ...: read in order
            )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "revision":
        sys.exit('usage: python -m api.core.migrate revision "what changes"')
    _autogenerate(sys.argv[2])
