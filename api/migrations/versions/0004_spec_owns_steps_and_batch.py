"""The job's spec owns its steps and global batch: the copies in ``jobs`` columns go.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Not in batch mode: on SQLite a batch copies ``jobs`` and drops the old table,
which (foreign keys on) would cascade-delete every job's steps, logs, events
and checkpoints. ``ALTER TABLE ... DROP COLUMN`` needs SQLite 3.35 or newer.
"""

from __future__ import annotations

import json
import sqlite3

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = ("steps", "global_batch")
"""Both are fields of the spec (``spec_json``), which every reader asks."""


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
        raise RuntimeError(
            f"migration 0004: SQLite {sqlite3.sqlite_version} cannot drop a column; "
            "hetsched needs SQLite 3.35 or newer"
        )
    for name in COLUMNS:
        op.drop_column("jobs", name)


def downgrade() -> None:
    for name in COLUMNS:
        op.add_column("jobs", sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id"), sa.column("spec_json"), *map(sa.column, COLUMNS))
    for job_id, spec_json in bind.execute(sa.select(jobs.c.id, jobs.c.spec_json)).all():
        spec = json.loads(spec_json)
        values = {name: spec[name] for name in COLUMNS}
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(**values))
