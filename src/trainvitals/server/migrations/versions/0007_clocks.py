"""Shared steps and times (#20): a run's series that have the very same steps at the very same
times (its per-step series; its system series) keep them once.

- ``clocks``: encoded steps and times of compacted blocks, a row per distinct pair in a run,
  keyed by ``(run_id, id)``, ``id`` a hash of them.
- ``chunks.clock``: NULL (every row before this revision: they read as they always did), or
  the ``clocks`` row that holds the block's steps and times (its own are then empty).

The downgrade puts each block's steps and times back in its row before dropping them. Only
this version and later read a block whose steps and times are in a clock: replicas are upgraded
together, not one at a time (docs/operations.md).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clocks",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("steps", sa.LargeBinary(), nullable=False),
        sa.Column("times", sa.LargeBinary(), nullable=False),
    )
    op.add_column("chunks", sa.Column("clock", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    chunks, clocks = _steps_and_times("chunks", "clock"), _steps_and_times("clocks", "id")

    def of_its_clock(column: sa.ColumnClause[bytes]) -> sa.ScalarSelect[bytes]:
        mine = (clocks.c.run_id == chunks.c.run_id, clocks.c.id == chunks.c.clock)
        return sa.select(column).where(*mine).scalar_subquery()

    op.execute(
        chunks.update()
        .where(chunks.c.clock.is_not(None))
        .values(steps=of_its_clock(clocks.c.steps), times=of_its_clock(clocks.c.times))
    )
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("clock")
    op.drop_table("clocks")


def _steps_and_times(table: str, clock: str) -> sa.TableClause:
    """The columns of ``table`` that the downgrade uses: run, clock id, steps and times."""
    return sa.table(
        table,
        sa.column("run_id", sa.String()),
        sa.column(clock, sa.BigInteger()),
        sa.column("steps", sa.LargeBinary()),
        sa.column("times", sa.LargeBinary()),
    )
