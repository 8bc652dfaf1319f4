"""The points of runs' series: one ``chunks`` row per series and frame, and the ``series``
index of each run's names (see :mod:`~trainvitals.server.storage.schema`). Compacted blocks keep
their steps and times in the run's ``clocks``, once for all the series that have the same."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from trainvitals.protocol import AnyColumns, ArrayColumns, ClockedSeries, Columns
from trainvitals.server.downsample import downsample_indices
from trainvitals.server.run_lifecycle import ALIVE
from trainvitals.server.settings import Retention
from trainvitals.server.storage import codec
from trainvitals.server.storage.run_queries import past_days
from trainvitals.server.storage.runs import lock_run
from trainvitals.server.storage.schema import chunks, clocks, runs, series
from trainvitals.server.storage.summary import Summary, last_point, summary_at
from trainvitals.server.storage.unit_of_work import HeldChunk, UnitOfWork

#: The chunk rows beside the clocks that hold their steps and times (see :func:`_points`).
_WITH_CLOCKS = chunks.outerjoin(
    clocks, and_(clocks.c.run_id == chunks.c.run_id, clocks.c.id == chunks.c.clock)
)
_OWN = chunks.c.clock.is_(None)
#: A chunk row's points as :func:`codec.decode` takes them (NULL steps and times: a block whose
#: clock is missing, which decoding names).
_POINTS = (
    chunks.c.encoding,
    chunks.c.n,
    case((_OWN, chunks.c.steps), else_=clocks.c.steps),
    case((_OWN, chunks.c.times), else_=clocks.c.times),
    chunks.c.vals,
)
#: Chunk rows (agent frames of one series) read at a time by :meth:`SeriesStore.iter_series`.
EXPORT_BATCH_ROWS = 32


#: Points a compacted block holds at most (1.5 MiB raw; a few hundred KiB encoded).
BLOCK_POINTS = 65_536


@dataclass(frozen=True)
class Due:
    """A run to compact, through which frame, and whether it has ended."""

    run_id: str
    through: int
    ended: bool


class SeriesStore:
    """The ``chunks`` and ``series`` tables."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- writes (writer thread) --------------------------------------------------------------

    def add_points(
        self, work: UnitOfWork, run_id: str, seq: int, points: Mapping[str, AnyColumns], now: float
    ) -> int | None:
        """Hold one frame's points in ``work``, written with the transaction's other frames
        as it commits (:meth:`UnitOfWork.flush`), and the run's progress; returns the highest
        step in it (None when empty, or when the run was deleted earlier in this
        transaction)."""
        if work.deleted(run_id):
            return None
        rows = []
        last_step: int | None = None
        frame = ClockedSeries.of(points)
        # Each clock of the frame (the steps and times its series share) is packed once.
        clocks: dict[int, tuple[bytes, bytes, int, tuple[int, int]]] = {}
        summaries: dict[str, Summary] = {}
        for name, (index, values) in frame.series.items():
            clock = clocks.get(index)
            if clock is None:
                steps, times = frame.clocks[index]
                step_array = np.asarray(steps, dtype=np.int64)
                if step_array.size == 0:
                    continue
                # Written as they come, in the cheap packed layout: the writer thread keeps up
                # with ingest; the compactor encodes them later, many frames at a time.
                clock = clocks[index] = (
                    *codec.encode_raw_clock(step_array, times),
                    int(step_array.size),
                    last_point(step_array),
                )
            step_bytes, time_bytes, n, last = clock
            value_array = np.asarray(values, dtype=np.float64)
            rows.append(
                HeldChunk(run_id, name, seq, n, step_bytes, time_bytes,
                          codec.encode_raw_values(value_array))
            )  # fmt: skip
            summary = summaries[name] = summary_at(value_array, *last)
            top = summary.last_step
            last_step = top if last_step is None else max(last_step, top)
        work.hold_frame(run_id, seq, now, rows, summaries, last_step)
        return last_step

    # -- reads (thread pool) -----------------------------------------------------------------

    def read_series(self, run_id: str, name: str) -> ArrayColumns:
        """Every point of one series, ordered by step."""
        query = (
            _points()
            .where(chunks.c.run_id == run_id, chunks.c.series == name)
            .order_by(chunks.c.seq)
        )
        with self._engine.connect() as conn:
            steps, times, values = codec.decode(conn.execute(query).all())
        if steps.size > 1 and np.any(steps[1:] < steps[:-1]):
            order = np.argsort(steps, kind="stable")
            steps, times, values = steps[order], times[order], values[order]
        return Columns(steps, times, values)

    def iter_series(
        self, run_id: str, name: str, batch_rows: int = EXPORT_BATCH_ROWS
    ) -> Iterator[ArrayColumns]:
        """Every point of one series as stored, in frame order (the order the agent sent
        them), ``batch_rows`` chunk rows at a time: a series of any length is read without
        holding it all. One query, its rows fetched as they are used (a server-side cursor on
        PostgreSQL), so it reads one snapshot: a compaction meanwhile, which replaces frames
        by a block keyed by the last of them, is seen entirely or not at all."""
        query = (
            _points()
            .where(chunks.c.run_id == run_id, chunks.c.series == name)
            .order_by(chunks.c.seq)
        )
        with self._engine.connect() as conn:
            result = conn.execution_options(yield_per=batch_rows).execute(query)
            for rows in result.partitions():
                yield codec.decode(rows)

    def recent_points(
        self, run_id: str, frames: int, points: int | None = None
    ) -> dict[str, ArrayColumns]:
        """The points of the run's last ``frames`` frames, per series, in frame order, and of
        each series at most its last ``points``: the history the alert engine replays to
        rebuild its state after a restart."""
        with self._engine.connect() as conn:
            last = conn.execute(select(runs.c.last_seq).where(runs.c.id == run_id)).scalar()
            if last is None:
                return {}
            rows = conn.execute(
                _points(chunks.c.series)
                .where(chunks.c.run_id == run_id, chunks.c.seq > last - frames)
                .order_by(chunks.c.seq)
            ).all()
        parts: dict[str, list[codec.Row]] = {}
        for row in rows:
            parts.setdefault(row[0], []).append(row[1:])
        decoded = {name: codec.decode(chunk) for name, chunk in parts.items()}
        if points is None:
            return decoded
        return {
            name: Columns(steps[-points:], times[-points:], values[-points:])
            for name, (steps, times, values) in decoded.items()
        }

    # -- compaction (the compactor's thread) ------------------------------------------------

    def runs_to_compact(self, live_margin: int, live_after: int, limit: int = 100) -> list[Due]:
        """Runs with frames to compact: ended ones with frames beyond ``compacted_seq``, and
        live ones with ``live_after`` frames more than ``live_margin`` behind their last."""
        done = func.coalesce(runs.c.compacted_seq, 0)
        ended = runs.c.status.not_in([s.value for s in ALIVE])
        query = (
            select(runs.c.id, runs.c.last_seq, ended.label("ended"))
            .where(
                or_(
                    and_(ended, runs.c.last_seq > done),
                    and_(~ended, runs.c.last_seq - live_margin - done >= live_after),
                )
            )
            .order_by(runs.c.last_seen)
            .limit(limit)
        )
        with self._engine.connect() as conn:
            return [
                Due(run_id, last if ended else last - live_margin, bool(ended))
                for run_id, last, ended in conn.execute(query)
            ]

    def compact(self, due: Due, block_points: int = BLOCK_POINTS) -> int:
        """Merge the run's frames up to ``due.through``, series by series, into blocks of up
        to ``block_points`` points in the compact encoding, each keyed by the last ``seq`` it
        holds, so reading by ``seq`` still gives the points in the order they were sent. Of a
        live run only full blocks are made (the rest waits for more frames); of an ended one,
        the rest too. Frames at or below the stored ``last_seq`` are never written again (the
        ingest drops replays), so a merged frame cannot come back beside its block.

        Each block is its own short transaction, checked against what it read, so a reader
        or another replica's compactor sees either the frames or the block, never both.
        Returns the rows merged."""
        merged = 0
        with self._engine.connect() as conn:
            names = list(
                conn.execute(select(series.c.name).where(series.c.run_id == due.run_id)).scalars()
            )
        for name in names:
            for group in self._groups(due, name, block_points):
                merged += self._merge(due.run_id, name, group)
        with self._engine.begin() as conn:
            conn.execute(
                update(runs)
                .where(
                    runs.c.id == due.run_id, func.coalesce(runs.c.compacted_seq, 0) < due.through
                )
                .values(compacted_seq=due.through)
            )
        return merged

    def _groups(self, due: Due, name: str, block_points: int) -> list[list[int]]:
        """The seqs of each block to make: consecutive frames, up to ``block_points`` points."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                select(chunks.c.seq, chunks.c.encoding, chunks.c.n)
                .where(chunks.c.run_id == due.run_id, chunks.c.series == name,
                       chunks.c.seq <= due.through)
                .order_by(chunks.c.seq)
            ).all()  # fmt: skip
        groups: list[list[int]] = []
        group: list[int] = []
        size = 0
        raw = False

        def close(full: bool) -> None:
            nonlocal group, size, raw
            if (full or due.ended) and (len(group) > 1 or raw):
                groups.append(group)
            group, size, raw = [], 0, False

        for seq, encoding, n in rows:
            if encoding == codec.CURRENT and n >= block_points // 2:
                close(full=True)  # a block already: left as it is
                continue
            if group and size + n > block_points:
                close(full=True)
            group.append(seq)
            size += n
            raw = raw or encoding != codec.CURRENT
        close(full=size >= block_points)
        return groups

    def _merge(self, run_id: str, name: str, group: list[int]) -> int:
        where = (chunks.c.run_id == run_id, chunks.c.series == name,
                 chunks.c.seq.between(group[0], group[-1]))  # fmt: skip
        with self._engine.begin() as conn:
            rows = _locked_rows(conn, run_id, where)
            if [row[0] for row in rows] != group:
                return 0  # merged meanwhile (another replica)
            points = codec.decode([row[2:] for row in rows])
            _replace(conn, run_id, name, where, rows, points)
        return len(rows)

    # -- retention (the compactor's thread) -------------------------------------------------

    def runs_to_thin(self, now: float, after_days: Retention, limit: int = 100) -> list[str]:
        """Ended runs not yet thinned whose end is older than their project's days."""
        old = past_days(after_days, runs.c.ended_at, now)
        if old is None:
            return []
        query = (
            select(runs.c.id)
            .where(runs.c.thinned_at.is_(None), runs.c.status.not_in([s.value for s in ALIVE]))
            .where(old)
            .order_by(runs.c.ended_at)
            .limit(limit)
        )
        with self._engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def thin(self, run_id: str, max_points: int, now: float) -> int:
        """Thin each of the run's series to at most ``max_points`` points (each bucket's
        minimum and maximum, and its first NaN/Inf: :func:`downsample_indices`), as one
        block keyed by its last frame; returns the points removed. A series per transaction,
        under the run's row lock on PostgreSQL, and a thinned series is left as it is, so
        replicas may all run it."""
        with self._engine.connect() as conn:
            names = list(
                conn.execute(select(series.c.name).where(series.c.run_id == run_id)).scalars()
            )
        removed = 0
        for name in names:
            where = (chunks.c.run_id == run_id, chunks.c.series == name)
            with self._engine.begin() as conn:
                rows = _locked_rows(conn, run_id, where)
                total = sum(int(row.n) for row in rows)
                if total <= max_points:
                    continue
                steps, times, values = codec.decode([row[2:] for row in rows])
                keep = downsample_indices(values, max_points)
                kept = Columns(steps[keep], times[keep], values[keep])
                _replace(conn, run_id, name, where, rows, kept)
                removed += total - int(keep.size)
        with self._engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(thinned_at=now))
        return removed

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
                    select(chunks.c.encoding, chunks.c.vals)
                    .where(chunks.c.run_id == run_id, chunks.c.series == name)
                    .order_by(chunks.c.seq.desc())
                    .limit(1)
                ).first()
                if row is not None:
                    out[name] = codec.last_value(row[0], row[1])
        return out


#: A chunk row as :func:`_locked_rows` reads it: seq, clock, then :data:`_POINTS`.
_ChunkRow = Row[Any, Any, Any, Any, Any, Any, Any]


def _points(*first: ColumnElement[Any]) -> Select[Any]:
    """A query of chunk rows: ``first``, then :data:`_POINTS`."""
    return select(*first, *_POINTS).select_from(_WITH_CLOCKS)


def _locked_rows(
    conn: Connection, run_id: str, where: tuple[ColumnElement[bool], ...]
) -> Sequence[_ChunkRow]:
    """The chunk rows ``where`` (seq and clock first, then :data:`_POINTS`), in seq order,
    read under the run's row lock on PostgreSQL: one compactor or thinner a run at a time
    across replicas (SQLite has one writer anyway); the clocks too are written under it."""
    lock_run(conn, run_id)
    query = _points(chunks.c.seq, chunks.c.clock).where(*where).order_by(chunks.c.seq)
    return conn.execute(query).all()


def _replace(
    conn: Connection,
    run_id: str,
    name: str,
    where: tuple[ColumnElement[bool], ...],
    rows: Sequence[_ChunkRow],
    points: ArrayColumns,
) -> None:
    """Put ``points`` in one block in place of the chunk ``rows`` (all those ``where``), keyed
    by the last of them; then drop the clocks that they used and no block uses any more."""
    conn.execute(delete(chunks).where(*where))
    steps, times, values = codec.encode(*points)
    clock = _clock(conn, run_id, steps, times)
    if clock is not None:
        steps = times = b""  # in the clock
    conn.execute(
        insert(chunks).values(
            run_id=run_id, series=name, seq=rows[-1][0], n=int(points.steps.size),
            steps=steps, times=times, vals=values, encoding=codec.CURRENT, clock=clock,
        )
    )  # fmt: skip
    freed = {row[1] for row in rows if row[1] is not None}
    if freed:
        used = select(chunks.c.clock).where(
            chunks.c.run_id == run_id, chunks.c.clock == clocks.c.id
        )
        conn.execute(
            delete(clocks).where(clocks.c.run_id == run_id, clocks.c.id.in_(freed), ~exists(used))
        )


def _clock(conn: Connection, run_id: str, steps: bytes, times: bytes) -> int | None:
    """The id of the run's clock that holds exactly these encoded ``steps`` and ``times``,
    stored now if no block of the run has them yet. Its id is a hash of them: None (the block
    keeps them in its own row) if a different pair had the same one."""
    digest = hashlib.blake2b(len(steps).to_bytes(8, "little"), digest_size=8)
    digest.update(steps)
    digest.update(times)
    clock = int.from_bytes(digest.digest(), "little", signed=True)
    stored = conn.execute(
        select(clocks.c.steps, clocks.c.times).where(
            clocks.c.run_id == run_id, clocks.c.id == clock
        )
    ).first()
    if stored is None:
        conn.execute(insert(clocks).values(run_id=run_id, id=clock, steps=steps, times=times))
        return clock
    return clock if bytes(stored[0]) == steps and bytes(stored[1]) == times else None
