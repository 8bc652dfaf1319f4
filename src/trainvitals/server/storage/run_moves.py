"""A run's status changes, made in the database: every one is a move of the run lifecycle
(:func:`trainvitals.server.run_lifecycle.moves`), applied by :func:`moved_status`; and the
runs' progress over the frames of a transaction (:func:`write_progress`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import BigInteger, Connection, Float, and_, bindparam, case, func, update
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement

from trainvitals.protocol import RunStatus
from trainvitals.server.run_lifecycle import Event, Progress, moves
from trainvitals.server.storage.schema import runs


def moved_status(event: Event, when: ColumnElement[bool] | None = None) -> ColumnElement[Any]:
    """The run's status after ``event``, as SQL: the lifecycle's moves, applied in the
    database so a concurrent writer can't slip between reading and writing the status."""
    whens = [
        (
            runs.c.status == before.value
            if when is None
            else and_(runs.c.status == before.value, when),
            after.value,
        )
        for before, after in moves(event).items()
    ]
    return case(*whens, else_=runs.c.status) if whens else runs.c.status


def status_values(statuses: Iterable[RunStatus]) -> list[str]:
    """The statuses as the ``runs.status`` column holds them."""
    return [status.value for status in statuses]


#: A run's progress over the frames of one transaction: its last frame, when that was heard,
#: and the highest step in them (None: they held no points).
FrameProgress = tuple[int, float, int | None]


def merge_progress(
    before: FrameProgress | None, seq: int, now: float, step: int | None
) -> FrameProgress:
    """A run's progress after one more frame (``seq``, heard at ``now``, highest ``step``):
    what :func:`write_progress` writing the two at once leaves is what writing them one after
    the other would (the row's guard is its last frame)."""
    if before is None:
        return seq, now, step
    steps = [s for s in (before[2], step) if s is not None]
    return max(before[0], seq), max(before[1], now), max(steps) if steps else None


def write_progress(conn: Connection, progress: Mapping[str, FrameProgress]) -> None:
    """The runs' rows after frames of points (run id -> :data:`FrameProgress`): last seen, last
    frame, and their step when that is progress; one ``executemany`` (a round trip) for all of
    them, compiled once and sent on the driver's connection (by the unit of work: see
    :meth:`UnitOfWork.connection
    <trainvitals.server.storage.unit_of_work.UnitOfWork.connection>`). A frame's update, made
    and sent alone, took more time than storing its points."""
    raw: Any = conn.connection.driver_connection
    for stepped in (True, False):
        rows = [
            {"run_id": run_id, "seq": seq, "now": now, "step": step}
            for run_id, (seq, now, step) in progress.items()
            if (step is not None) == stepped
        ]
        if not rows:
            continue
        sql, constants, order = _progress(conn.dialect, stepped)
        params = [{**constants, **row} for row in rows]
        if order is None:  # named parameters (psycopg)
            with raw.cursor() as cursor:
                cursor.executemany(sql, params)
        else:  # positional (sqlite3)
            raw.executemany(sql, [tuple(p[name] for name in order) for p in params])


@functools.lru_cache(maxsize=8)  # by the engine's dialect: one or two in a server
def _progress(
    dialect: Dialect, stepped: bool
) -> tuple[str, dict[str, str | int], list[str] | None]:
    """:func:`write_progress`'s statement as the driver takes it, compiled once: its SQL, the
    values of its constant parameters (the statuses :func:`moved_status` compares with), and the
    order of the parameters where they are positional (None: by name)."""
    seq = bindparam("seq", type_=BigInteger)
    changes: dict[str, ColumnElement[Any]] = {
        "last_seq": seq,
        "last_seen": bindparam("now", type_=Float),
    }
    if stepped:
        # Only a step beyond the stored last one is progress (see trainvitals.server.run_lifecycle):
        # the per-second samples filed under the latest step do not end a stall.
        step = bindparam("step", type_=BigInteger)
        advanced = func.coalesce(runs.c.last_step, -1) < step
        changes["status"] = moved_status(Progress(0), advanced)
        larger = func.greatest if dialect.name == "postgresql" else func.max
        changes["last_step"] = larger(func.coalesce(runs.c.last_step, step), step)
    where = (runs.c.id == bindparam("run_id"), runs.c.last_seq < seq)
    compiled = update(runs).where(*where).values(**changes).compile(dialect=dialect)
    placeholders = {"run_id": "", "seq": 0, "now": 0.0, "step": 0}
    every = compiled.construct_params(placeholders)
    constants = {k: v for k, v in every.items() if k not in placeholders}
    order = None if compiled.positiontup is None else list(compiled.positiontup)
    return compiled.string, constants, order
