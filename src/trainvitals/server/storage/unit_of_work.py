"""The writes of one transaction, and when they are made (:class:`UnitOfWork`).

Every write operation gets the unit of work of the transaction it runs in. A statement it runs
goes to the database at once, on :meth:`UnitOfWork.connection`. The points of agent frames are
held instead (:meth:`SeriesStore.add_points
<trainvitals.server.storage.series.SeriesStore.add_points>`) and written by
:meth:`UnitOfWork.flush`, every frame of the transaction at once, just before it commits: the
:class:`~trainvitals.server.writer.Writer` groups hundreds of frames in one transaction, and
their rows written frame by frame cost more than the points. A transaction that rolls back
drops its unit of work: nothing it held is written.

Writes made outside the writer take a unit of work from :func:`transaction` (or
:meth:`Store.transaction <trainvitals.server.store.Store.transaction>`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection

from trainvitals.server.storage.run_moves import FrameProgress, merge_progress, write_progress
from trainvitals.server.storage.summary import Summary, SummaryColumns


class HeldChunk(NamedTuple):
    """One series' points of one frame: its ``chunks`` row as it is inserted (the packed
    layout; the compactor encodes them later, many frames at a time)."""

    run_id: str
    series: str
    seq: int
    n: int
    steps: bytes
    times: bytes
    vals: bytes


class UnitOfWork:
    """The writes of one transaction on ``conn``: statements run now, frames' points held
    until :meth:`flush`.

    Example:
        ```python
        with transaction(conn) as work:  # flushed, then committed
            store.series.add_points(work, "r1", 1, {"loss": Columns([1], [1.0], [0.5])}, 2.0)
            store.runs.end_run(work, "r1", 2, RunEnd("completed", 3.0, None))
        ```
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._chunks: list[HeldChunk] = []
        #: Each series' summary over the frames held, by (run id, series name).
        self._summaries: dict[tuple[str, str], Summary] = {}
        #: Each run's progress over the frames held, until it is written.
        self._progress: dict[str, FrameProgress] = {}
        #: The runs deleted in this transaction: their later frames are dropped.
        self._deleted: set[str] = set()

    def connection(self) -> Connection:
        """The transaction's connection, for statements to run now. The progress of the
        frames held so far is written first (one round trip for all their runs), so that the
        statements read and change the runs' rows as those frames leave them."""
        if self._progress:
            write_progress(self._conn, self._progress)
            self._progress = {}
        return self._conn

    def hold_frame(
        self,
        run_id: str,
        seq: int,
        now: float,
        rows: Sequence[HeldChunk],
        summaries: Mapping[str, Summary],
        last_step: int | None,
    ) -> None:
        """Hold a frame of ``run_id``: its chunk ``rows``, the ``summaries`` of its series'
        points, and the run's progress (frame ``seq`` heard at ``now``, highest step
        ``last_step``: None when it held no points)."""
        self._chunks.extend(rows)
        for name, summary in summaries.items():
            earlier = self._summaries.get((run_id, name))
            self._summaries[(run_id, name)] = summary if earlier is None else earlier.then(summary)
        self._progress[run_id] = merge_progress(self._progress.get(run_id), seq, now, last_step)

    def deleted(self, run_id: str) -> bool:
        """Whether the run was deleted in this transaction (its frames are dropped)."""
        return run_id in self._deleted

    def forget_run(self, run_id: str) -> None:
        """The run is deleted in this transaction: its frames held, and any that come later
        in it, are not to be stored (they would make its series' rows again)."""
        self._deleted.add(run_id)
        self._chunks = [row for row in self._chunks if row.run_id != run_id]
        for key in [key for key in self._summaries if key[0] == run_id]:
            del self._summaries[key]
        self._progress.pop(run_id, None)

    def flush(self) -> None:
        """Write what is held: the runs' progress, each series' summary merged into its
        ``series`` row (made by the first frame of each), and the frames' chunks, skipping
        those stored already (a replay). The transaction commits after."""
        conn = self.connection()
        rows, summaries = self._chunks, _summary_rows(self._summaries)
        self._chunks, self._summaries = [], {}
        if rows or summaries:
            _write_frames(conn, rows, summaries)


@contextlib.contextmanager
def transaction(conn: Connection) -> Iterator[UnitOfWork]:
    """A transaction on ``conn`` and its unit of work, flushed before it commits. When the
    block raises, the transaction rolls back and what the unit held goes with it."""
    with conn.begin():
        work = UnitOfWork(conn)
        yield work
        work.flush()


class _SummaryRow(SummaryColumns):
    """A ``series`` row's summary, keyed by its run and name: a row of the summaries' upsert."""

    run_id: str
    name: str


_CHUNK_COLUMNS = ", ".join(HeldChunk._fields)
_CHUNK_TYPES = ["text", "text", "int8", "int4", "bytea", "bytea", "bytea"]
#: Chunks in one transaction from which COPY is worth its extra round trips.
_COPY_FROM_ROWS = 200
_SUMMARY_ROW = ("run_id", "name", *SummaryColumns.__annotations__)
_NEWER = "series.last_step IS NULL OR excluded.last_step >= series.last_step"
#: Each series' summary merged with a transaction's (both engines take this upsert; in SET,
#: every column reads the row as it was).
_UPSERT_SUMMARY = (
    f"INSERT INTO series ({', '.join(_SUMMARY_ROW)}) {{rows}} "
    "ON CONFLICT (run_id, name) DO UPDATE SET "
    + ", ".join(
        f"{c} = CASE WHEN {_NEWER} THEN excluded.{c} ELSE series.{c} END"
        for c in ("last_step", "last_value", "last_nonfinite")
    )
    + ", min_value = CASE WHEN series.min_value IS NULL OR excluded.min_value < "
    "series.min_value THEN excluded.min_value ELSE series.min_value END"
    ", max_value = CASE WHEN series.max_value IS NULL OR excluded.max_value > "
    "series.max_value THEN excluded.max_value ELSE series.max_value END"
)
#: The summaries' upserts: SQLite's, a row at a time (``executemany``, in process);
#: PostgreSQL's, every row in one statement from one JSON parameter (a statement a row, even
#: pipelined, cost the writer about 3 times the CPU, and arrays, one a column, twice: the
#: driver looks at each element of a list). JSON numbers are exact: ``repr`` writes a float's
#: shortest exact text, and PostgreSQL reads it back to the same float8.
_UPSERT_SUMMARY_ROWS = _UPSERT_SUMMARY.format(rows="VALUES (?, ?, ?, ?, ?, ?, ?)")
_UPSERT_SUMMARY_JSON = _UPSERT_SUMMARY.format(
    rows="SELECT * FROM json_to_recordset(%s::json) AS r(run_id text, name text, last_step int8, "
    "last_value float8, last_nonfinite text, min_value float8, max_value float8)"
)


def _summary_rows(summaries: Mapping[tuple[str, str], Summary]) -> list[_SummaryRow]:
    """A transaction's series summaries as the upsert's rows, in key order, so that two
    writers never wait on each other's rows in opposite orders."""
    return [
        _SummaryRow(run_id=run_id, name=name, **summary.columns())
        for (run_id, name), summary in sorted(summaries.items())
    ]


def _in_order(
    row: _SummaryRow,
) -> tuple[str, str, int, float | None, str | None, float | None, float | None]:
    """An upsert's row as positional parameters, in the order of :data:`_SUMMARY_ROW`."""
    return (row["run_id"], row["name"], row["last_step"], row["last_value"],
            row["last_nonfinite"], row["min_value"], row["max_value"])  # fmt: skip


def _write_frames(conn: Connection, rows: list[HeldChunk], summaries: list[_SummaryRow]) -> None:
    """Insert the chunks of the transaction's frames at once, and upsert its series'
    summaries, on the driver's connection. On PostgreSQL, many chunks go through ``COPY``,
    into a temporary table and then on with an insert that skips the frames stored already:
    three round trips for the lot, not one a frame; a few go in one ``executemany``,
    pipelined with the summaries' upsert in one round trip."""
    raw: Any = conn.connection.driver_connection
    if conn.dialect.name != "postgresql":
        if summaries:
            raw.executemany(_UPSERT_SUMMARY_ROWS, [_in_order(row) for row in summaries])
        if rows:
            marks = ", ".join("?" for _ in HeldChunk._fields)
            raw.executemany(
                f"INSERT OR IGNORE INTO chunks ({_CHUNK_COLUMNS}) VALUES ({marks})", rows
            )
        return
    from psycopg import Pipeline  # PostgreSQL's driver, there when it is the database

    copied = len(rows) >= _COPY_FROM_ROWS
    with raw.cursor() as cursor:
        if copied:
            cursor.execute(
                "CREATE TEMP TABLE IF NOT EXISTS chunks_in (LIKE chunks) ON COMMIT DELETE ROWS"
            )
            with cursor.copy(
                f"COPY chunks_in ({_CHUNK_COLUMNS}) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(_CHUNK_TYPES)  # the blobs as they are, not hex text
                for row in rows:
                    copy.write_row(row)
        # One round trip for both, where libpq pipelines (psycopg's binary wheel does).
        with raw.pipeline() if Pipeline.is_supported() else contextlib.nullcontext():
            if summaries:  # every row in one statement
                cursor.execute(_UPSERT_SUMMARY_JSON, [json.dumps(summaries, allow_nan=False)])
            if copied:
                cursor.execute(
                    f"INSERT INTO chunks ({_CHUNK_COLUMNS}) SELECT {_CHUNK_COLUMNS} "
                    "FROM chunks_in ON CONFLICT DO NOTHING"
                )
            elif rows:
                marks = ", ".join("%s" for _ in HeldChunk._fields)
                cursor.executemany(
                    f"INSERT INTO chunks ({_CHUNK_COLUMNS}) VALUES ({marks}) "
                    "ON CONFLICT DO NOTHING",
                    rows,
                )
