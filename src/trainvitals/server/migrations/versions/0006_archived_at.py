"""When a run was archived (#20), so that archived runs can be deleted some days after.

- ``runs.archived_at``: set when a run is archived, cleared when it is brought back (NULL: not
  archived). Runs archived before this revision get the time of the migration: their days
  count from the upgrade, never from before anyone could know.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("archived_at", sa.Float(), nullable=True))
    runs = sa.table(
        "runs", sa.column("archived", sa.Boolean()), sa.column("archived_at", sa.Float())
    )
    op.execute(runs.update().where(runs.c.archived == sa.true()).values(archived_at=time.time()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("archived_at")
