"""Alerts closed by their run's end (#16): a state of their own, not ``resolved``.

- ``alerts.closed_time``: when the run's end closed the alert (NULL: it was not closed).
- ``alerts.closed_reason``: why, e.g. ``run ended``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("alerts", sa.Column("closed_time", sa.Float(), nullable=True))
    op.add_column("alerts", sa.Column("closed_reason", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("closed_reason")
        batch.drop_column("closed_time")
