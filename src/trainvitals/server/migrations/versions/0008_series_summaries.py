"""Each series' summary in its ``series`` row, for the runs list's metric columns and sort orders:

- ``last_step``, ``last_value``, ``last_nonfinite``: the value at the series' highest step
  (NULL in ``last_value`` when it is NaN or ±Inf, which ``last_nonfinite`` names: ``nan``,
  ``inf``, ``-inf``);
- ``min_value``, ``max_value``: its least and greatest finite values.

The writer keeps them as it stores frames. The upgrade fills them for the series stored before
it, reading every stored point once, a row at a time (under a second for ten million compacted
points), so old runs sort and show as new ones do. Of a run thinned before it (retention), the
"last" value is the last point the thinning kept; its least and greatest are exact.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import sqlalchemy as sa
from alembic import op

from trainvitals.exceptions import StorageError
from trainvitals.server.storage import codec
from trainvitals.server.storage.summary import Summary, summarize

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

log = logging.getLogger(__name__)

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


def _fill(batch: int = 1000) -> None:
    """The summary of every series stored before this revision, from its points: one query
    read as it goes (a server-side cursor on PostgreSQL), each row decoded alone, the updates
    written ``batch`` at a time. A series whose rows cannot be read (a block whose clock is
    missing) is left without one, and said in the log: the upgrade goes on."""
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
            chunks.c.run_id,
            chunks.c.series,
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
        .order_by(chunks.c.run_id, chunks.c.series, chunks.c.seq)
    )
    fill = (
        series.update()
        .where(series.c.run_id == sa.bindparam("run"), series.c.name == sa.bindparam("series_name"))
        .values({c: sa.bindparam(f"new_{c}") for c in _COLUMNS})
    )
    updates: list[dict[str, Any]] = []

    def done(key: tuple[str, str], summary: Summary | None) -> None:
        if summary is not None:
            columns = {f"new_{c}": v for c, v in summary.columns().items()}
            updates.append({"run": key[0], "series_name": key[1], **columns})
        if len(updates) >= batch:
            bind.execute(fill, updates)
            updates.clear()

    key: tuple[str, str] | None = None
    summary: Summary | None = None
    broken = False
    for run_id, name, *row in bind.execute(points.execution_options(yield_per=256)):
        if (run_id, name) != key:
            if key is not None and not broken:
                done(key, summary)
            key, summary, broken = (run_id, name), None, False
        if broken:
            continue
        try:
            steps, _, values = codec.decode([row])
        except (StorageError, ValueError, zlib.error) as exc:  # a clock missing, a torn blob
            log.warning(
                "revision 0008: series %r of run %s left unsummarised: %s", name, run_id, exc
            )
            broken = True
            continue
        more = summarize(steps, values)
        summary = more if summary is None else summary if more is None else summary.then(more)
    if key is not None and not broken:
        done(key, summary)
    if updates:
        bind.execute(fill, updates)
