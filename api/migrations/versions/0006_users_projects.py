"""A shared service: users, projects, memberships, datasets' owners, an audit log, and an
owner and project on every job (existing jobs: the admin's, in the default project).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

The jobs columns are added with plain ``ADD COLUMN`` (not batch mode, see 0004) and
no foreign key: SQLite refuses ``ADD COLUMN ... REFERENCES`` with a non-NULL default.
Only portable types and statements, so PostgreSQL runs the same revision.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

DEFAULT_USER = "admin"
DEFAULT_PROJECT = "default"
"""As in api/core/db.py when this revision was written (a revision never imports the
models, which move on)."""


def upgrade() -> None:
    users = op.create_table(
        "users",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("token_sha256"),
    )
    projects = op.create_table(
        "projects",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("max_devices", sa.Integer(), nullable=True),
        sa.Column("max_queued", sa.Integer(), nullable=True),
        sa.Column("max_priority", sa.Float(), nullable=True),
        sa.Column("storage_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    memberships = op.create_table(
        "memberships",
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["user_name"], ["users.name"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["project"], ["projects.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("user_name", "project"),
    )
    op.create_table(
        "datasets",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_datasets_project", "datasets", ["project"])
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("project", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_time", "audit", ["time"])
    op.create_index("ix_audit_action", "audit", ["action"])
    op.add_column(
        "jobs", sa.Column("owner", sa.String(64), nullable=False, server_default=DEFAULT_USER)
    )
    op.add_column(
        "jobs",
        sa.Column("project", sa.String(64), nullable=False, server_default=DEFAULT_PROJECT),
    )
    op.create_index("ix_jobs_project", "jobs", ["project"])
    now = datetime.now(UTC)
    op.bulk_insert(
        users, [{"name": DEFAULT_USER, "token_sha256": None, "is_admin": True, "created_at": now}]
    )
    op.bulk_insert(
        projects,
        [
            {
                "name": DEFAULT_PROJECT,
                "weight": 1.0,
                "max_devices": None,
                "max_queued": None,
                "max_priority": None,
                "storage_bytes": None,
                "created_at": now,
            }
        ],
    )
    op.bulk_insert(memberships, [{"user_name": DEFAULT_USER, "project": DEFAULT_PROJECT}])


def downgrade() -> None:
    op.drop_index("ix_jobs_project", table_name="jobs")
    op.drop_column("jobs", "project")
    op.drop_column("jobs", "owner")
    op.drop_index("ix_audit_action", table_name="audit")
    op.drop_index("ix_audit_time", table_name="audit")
    op.drop_table("audit")
    op.drop_index("ix_datasets_project", table_name="datasets")
    op.drop_table("datasets")
    op.drop_table("memberships")
    op.drop_table("projects")
    op.drop_table("users")
