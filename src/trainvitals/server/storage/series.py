"""The points of runs' series: one ``chunks`` row per series and frame, and the ``series``
index of each run's names (see :mod:`~trainvitals.server.storage.schema`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, event, select

from trainvitals.protocol import AnyColumns, ArrayColumns, Columns
from trainvitals.server.storage.runs import record_progress
from trainvitals.server.storage.schema import chunks, dialect_insert, runs, series

_PENDING_SERIES = "trainvitals.pending_series"  # in Connection.info: [(run id, [names])]
_PENDING_CHUNKS = "trainvitals.pending_chunks"  # in Connection.info: [chunk row]
_CHUNK_COLUMNS = ("run_id", "series", "seq", "n", "steps", "times", "vals")
_CHUNK_TYPES = ["text", "text", "int8", "int4", "bytea", "bytea", "bytea"]
#: Chunks in one transaction from which COPY is worth its extra round trips.
_COPY_FROM_ROWS = 200


class SeriesStore:
    """The ``chunks`` and ``series`` tables."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._insert_series = dialect_insert(engine, series).on_conflict_do_nothing()
        # Run id -> the series names this process has committed for it: a frame's known
        # series need no insert. Forgotten when the run ends (a run that speaks again only
        # costs inserts that are ignored).
        self._known: dict[str, set[str]] = {}
        event.listen(engine, "commit", self._flush)
        event.listen(engine, "rollback", self._drop)

    # -- writes (writer thread) --------------------------------------------------------------

    def add_points(
        self, conn: Connection, run_id: str, seq: int, points: Mapping[str, AnyColumns], now: float
    ) -> int | None:
        """Store one frame's points, and the run's progress; returns the highest step in
        it (None when empty)."""
        rows = []
        last_step: int | None = None
        for name, (steps, times, values) in points.items():
            step_array = np.asarray(steps, dtype=np.int64)
            if step_array.size == 0:
                continue
            rows.append(
                {
                    "run_id": run_id,
                    "series": name,
                    "seq": seq,
                    "n": int(step_array.size),
                    "steps": step_array.tobytes(),
                    "times": np.asarray(times, dtype=np.float64).tobytes(),
                    "vals": np.asarray(values, dtype=np.float64).tobytes(),
                }
            )
            top = int(step_array.max())
            last_step = top if last_step is None else max(last_step, top)
        if rows:
            # Stored as the transaction commits, with its other frames (``_flush``).
            conn.info.setdefault(_PENDING_CHUNKS, []).extend(rows)
            known = self._known.get(run_id, ())
            new = [r["series"] for r in rows if r["series"] not in known]
            if new:
                conn.execute(self._insert_series, [{"run_id": run_id, "name": n} for n in new])
                # Remembered once committed (see ``committed``): a rolled-back insert must be
                # made again when the frame is replayed.
                conn.info.setdefault(_PENDING_SERIES, []).append((run_id, new))
        record_progress(conn, run_id, seq, now, last_step)
        return last_step

    def _flush(self, conn: Connection) -> None:
        """Insert the chunks of every frame of the transaction at once, as it commits (the
        writer groups hundreds of frames in one). On PostgreSQL, many rows go through
        ``COPY``, into a temporary table and then on with an insert that skips the frames
        stored already: three round trips for the lot, not one a frame; a few rows go in one
        pipelined ``executemany``, which is one round trip."""
        rows = conn.info.pop(_PENDING_CHUNKS, None)
        if not rows:
            return
        # On the driver's connection: SQLAlchemy's is committing.
        raw: Any = conn.connection.driver_connection
        columns = ", ".join(_CHUNK_COLUMNS)
        values = [[row[c] for c in _CHUNK_COLUMNS] for row in rows]
        if conn.dialect.name != "postgresql":
            marks = ", ".join("?" for _ in _CHUNK_COLUMNS)
            raw.executemany(f"INSERT OR IGNORE INTO chunks ({columns}) VALUES ({marks})", values)
            return
        if len(rows) < _COPY_FROM_ROWS:
            marks = ", ".join("%s" for _ in _CHUNK_COLUMNS)
            with raw.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO chunks ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING",
                    values,
                )
            return
        with raw.cursor() as cursor:
            cursor.execute(
                "CREATE TEMP TABLE IF NOT EXISTS chunks_in (LIKE chunks) ON COMMIT DELETE ROWS"
            )
            with cursor.copy(f"COPY chunks_in ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(_CHUNK_TYPES)  # the blobs as they are, not hex text
                for row in values:
                    copy.write_row(row)
            cursor.execute(
                f"INSERT INTO chunks ({columns}) SELECT {columns} FROM chunks_in "
                "ON CONFLICT DO NOTHING"
            )

    def committed(self, conn: Connection) -> None:
        """The transaction on ``conn`` was committed: remember the series it stored."""
        for run_id, names in conn.info.pop(_PENDING_SERIES, ()):
            self._known.setdefault(run_id, set()).update(names)

    def rolled_back(self, conn: Connection) -> None:
        """The transaction on ``conn`` failed: what it stored is not there."""
        conn.info.pop(_PENDING_SERIES, None)
        conn.info.pop(_PENDING_CHUNKS, None)

    def _drop(self, conn: Connection) -> None:
        """The transaction rolls back: its held chunks are not to be stored."""
        if not conn.invalidated:  # else they go with the connection (``rolled_back``)
            conn.info.pop(_PENDING_CHUNKS, None)

    def forget(self, run_id: str) -> None:
        """The run ended: stop remembering its series."""
        self._known.pop(run_id, None)

    # -- reads (thread pool) -----------------------------------------------------------------

    def read_series(self, run_id: str, name: str) -> ArrayColumns:
        """Every point of one series, ordered by step."""
        query = (
            select(chunks.c.steps, chunks.c.times, chunks.c.vals)
            .where(chunks.c.run_id == run_id, chunks.c.series == name)
            .order_by(chunks.c.seq)
        )
        with self._engine.connect() as conn:
            steps, times, values = _unpack(conn.execute(query).all())
        if steps.size > 1 and np.any(steps[1:] < steps[:-1]):
            order = np.argsort(steps, kind="stable")
            steps, times, values = steps[order], times[order], values[order]
        return Columns(steps, times, values)

    def recent_points(self, run_id: str, frames: int) -> dict[str, ArrayColumns]:
        """The points of the run's last ``frames`` frames, per series, in frame order: the
        history the alert engine replays to rebuild its state after a restart."""
        with self._engine.connect() as conn:
            last = conn.execute(select(runs.c.last_seq).where(runs.c.id == run_id)).scalar()
            if last is None:
                return {}
            rows = conn.execute(
                select(chunks.c.series, chunks.c.steps, chunks.c.times, chunks.c.vals)
                .where(chunks.c.run_id == run_id, chunks.c.seq > last - frames)
                .order_by(chunks.c.seq)
            ).all()
        parts: dict[str, list[tuple[bytes, bytes, bytes]]] = {}
        for name, steps, times, values in rows:
            parts.setdefault(name, []).append((steps, times, values))
        return {name: _unpack(chunk) for name, chunk in parts.items()}

    def last_values(self, run_id: str, prefixes: tuple[str, ...]) -> dict[str, float]:
        """The last stored value of each of the run's series whose name starts with one of
        ``prefixes`` (the readings just before a run ended)."""
        out: dict[str, float] = {}
        with self._engine.connect() as conn:
            names = conn.execute(select(series.c.name).where(series.c.run_id == run_id))
            for name in names.scalars():
                if not name.startswith(prefixes):
                    continue
                row = conn.execute(
                    select(chunks.c.vals)
                    .where(chunks.c.run_id == run_id, chunks.c.series == name)
                    .order_by(chunks.c.seq.desc())
                    .limit(1)
                ).first()
                if row is not None:
                    out[name] = float(np.frombuffer(row[0], dtype=np.float64)[-1])
        return out


def _unpack(rows: Sequence[Sequence[bytes]]) -> ArrayColumns:
    """The points of consecutive chunks (rows of ``steps``, ``times``, ``vals``)."""
    return Columns(
        np.frombuffer(b"".join(c[0] for c in rows), dtype=np.int64),
        np.frombuffer(b"".join(c[1] for c in rows), dtype=np.float64),
        np.frombuffer(b"".join(c[2] for c in rows), dtype=np.float64),
    )
