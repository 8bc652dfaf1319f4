"""The process a run belongs to (#46), so that the runs one process makes are linked.

- ``runs.process_key``: the identity of the training process (host, pid and the process's
  start time, made by the agent), from its hello; NULL in runs from before it or from agents
  that do not send it. Indexed with the project, as the runs list filters by it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("process_key", sa.String(128), nullable=True))
    op.create_index("ix_runs_process_key", "runs", ["project", "process_key"])


def downgrade() -> None:
    op.drop_index("ix_runs_process_key", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("process_key")
