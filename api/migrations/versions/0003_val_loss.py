"""Validation loss: a nullable ``val_loss`` on each step (NULL where not evaluated).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite alters a table by copying it, other databases add the column
    with op.batch_alter_table("job_steps") as batch:
        batch.add_column(sa.Column("val_loss", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_steps") as batch:
        batch.drop_column("val_loss")
