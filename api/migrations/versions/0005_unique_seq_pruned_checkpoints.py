"""Queue sequence numbers are unique; a pruned checkpoint is remembered as pruned.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``jobs.seq`` gets a unique index (two services on one database, or two racing
submissions, can no longer give two jobs one place in the queue); a database
that already has duplicates is renumbered first, in the queue order it had
(``seq``, then submission time). ``job_checkpoints.pruned_at``: retention no
longer deletes the row, so a download of a pruned checkpoint answers 410 Gone
and one that never existed 404.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id"), sa.column("seq"), sa.column("created_at"))
    order = bind.execute(sa.select(jobs.c.id, jobs.c.seq).order_by(jobs.c.seq, jobs.c.created_at))
    rows = order.all()
    if len({seq for _, seq in rows}) != len(rows):
        for new_seq, (job_id, _) in enumerate(rows, start=1):
            bind.execute(jobs.update().where(jobs.c.id == job_id).values(seq=new_seq))
    op.drop_index("ix_jobs_seq", table_name="jobs")
    op.create_index("ix_jobs_seq", "jobs", ["seq"], unique=True)
    with op.batch_alter_table("job_checkpoints") as batch:
        batch.add_column(sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_checkpoints") as batch:
        batch.drop_column("pruned_at")
    op.drop_index("ix_jobs_seq", table_name="jobs")
    op.create_index("ix_jobs_seq", "jobs", ["seq"], unique=False)
