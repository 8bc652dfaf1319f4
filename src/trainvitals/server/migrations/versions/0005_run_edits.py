"""What people say of a run from the dashboard (#17), and the runs list's indexes.

- ``runs.tags``: a JSON list of tags (NULL: none); ``runs.notes``: free text (NULL: none);
  ``runs.archived``: hidden from the runs list by default (NULL: not archived).
- Indexes for the runs list's filters and orders (``GET /api/v1/runs``): project and status
  each with the start time, the name, the last time heard.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEXES = {
    "ix_runs_project_started": ["project", "started_at"],
    "ix_runs_status_started": ["status", "started_at"],
    "ix_runs_name": ["name"],
    "ix_runs_last_seen": ["last_seen"],
}


def upgrade() -> None:
    op.add_column("runs", sa.Column("tags", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("notes", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("archived", sa.Boolean(), nullable=True))
    for name, columns in INDEXES.items():
        op.create_index(name, "runs", columns)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("archived")
        batch.drop_column("notes")
        batch.drop_column("tags")
