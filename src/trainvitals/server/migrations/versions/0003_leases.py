"""Leases (#19): which replica judges a run, and which one sweeps for lost runs.

- ``leases``: a row per piece of work only one server process may do at a time
  (``run:<id>``, ``sweep:lost``): its owner (a process's random id) and when the lease runs
  out unless renewed. See ``trainvitals.server.storage.leases``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
