"""Compact points (#20): how a chunk's points are encoded, and how far the compactor and the
retention policy have gone in each run.

- ``chunks.encoding``: NULL (every row before this revision) or 0 for the packed layout, 1 for
  the delta-of-delta / XOR codec (``trainvitals.server.storage.codec``). Old rows keep
  reading as they are; the compactor rewrites them.
- ``runs.compacted_seq``: the frames up to it have been compacted (NULL: none yet).
- ``runs.thinned_at``: when its points were thinned by the retention policy (NULL: never).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("chunks", sa.Column("encoding", sa.SmallInteger(), nullable=True))
    op.add_column("runs", sa.Column("compacted_seq", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("thinned_at", sa.Float(), nullable=True))


def downgrade() -> None:
    # Compacted rows (encoding 1) can't be read without the column: decode them first.
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("thinned_at")
        batch.drop_column("compacted_seq")
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("encoding")
