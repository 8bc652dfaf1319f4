"""Each series' summary in its ``series`` row, for the runs list's metric columns and sort orders:

- ``last_step``, ``last_value``, ``last_nonfinite``: the value at the series' highest step
  (NULL in ``last_value`` when it is NaN or ±Inf, which ``last_nonfinite`` names: ``nan``,
  ``inf``, ``-inf``);
- ``min_value``, ``max_value``: its least and greatest finite values.

The writer keeps them as it stores frames. The upgrade fills them for the series stored before
it, reading each series' points once (a few seconds for ten million points), so old runs sort and
show as new ones do.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from trainvitals.server.storage import codec
from trainvitals.server.storage.summary import summarize

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_COLUMNS = ("last_step", "last_value", "last_nonfinite", "min_value", "max_value")


def upgrade() -> None:
    with op.batch_alter_table("series") as batch:
        batch.add_column(sa.Column("last_step", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("last_value", sa.Float(), nullable=True))
        batch.add_column(sa.Column("last_nonfinite", sa.String(8), nullable=True))
        batch.add_column(sa.Column("min_value", sa.Float(), nullable=True))
        batch.add_column(sa.Column("max_value", sa.Float(), nullable=True))
    _fill()


def downgrade() -> None:
    with op.batch_alter_table("series") as batch:
        for column in reversed(_COLUMNS):
            batch.drop_column(column)


def _fill() -> None:
    """The summary of every series stored before this revision, from its points."""
    bind = op.get_bind()
    series = sa.table(
        "series",
        sa.column("run_id", sa.String()),
        sa.column("name", sa.String()),
        *(sa.column(c) for c in _COLUMNS),
    )
    chunks = sa.table(
        "chunks",
        *(sa.column(c) for c in ("run_id", "series", "seq", "n", "encoding", "clock")),
        *(sa.column(c, sa.LargeBinary()) for c in ("steps", "times", "vals")),
    )
    clocks = sa.table(
        "clocks",
        sa.column("run_id", sa.String()),
        sa.column("id", sa.BigInteger()),
        sa.column("steps", sa.LargeBinary()),
        sa.column("times", sa.LargeBinary()),
    )
    own = chunks.c.clock.is_(None)
    points = (
        sa.select(
            chunks.c.encoding,
            chunks.c.n,
            sa.case((own, chunks.c.steps), else_=clocks.c.steps),
            sa.case((own, chunks.c.times), else_=clocks.c.times),
            chunks.c.vals,
        )
        .select_from(
            chunks.outerjoin(
                clocks, sa.and_(clocks.c.run_id == chunks.c.run_id, clocks.c.id == chunks.c.clock)
            )
        )
        .where(
            chunks.c.run_id == sa.bindparam("run"), chunks.c.series == sa.bindparam("series_name")
        )
        .order_by(chunks.c.seq)
    )
    fill = (
        series.update()
        .where(series.c.run_id == sa.bindparam("run"), series.c.name == sa.bindparam("series_name"))
        .values({c: sa.bindparam(f"new_{c}") for c in _COLUMNS})
    )
    names = bind.execute(sa.select(series.c.run_id, series.c.name)).all()
    for run_id, name in names:
        steps, _, values = codec.decode(
            bind.execute(points, {"run": run_id, "series_name": name}).all()
        )
        summary = summarize(steps, values)
        if summary is not None:
            columns = {f"new_{c}": v for c, v in summary.columns().items()}
            bind.execute(fill, {"run": run_id, "series_name": name, **columns})
