"""When each token was last used (to a minute), for an admin to find the tokens nobody uses.

- ``tokens.last_used_at``: written when a request, a websocket or a browser session proves
  itself with the token, at most once a minute; NULL for every token until its next use.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tokens", sa.Column("last_used_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("last_used_at")
