"""Storage of runs and their series, on SQLite or PostgreSQL through SQLAlchemy Core
(the tables: :mod:`~trainvitals.server.storage.schema`).

All methods are synchronous. Writes run on the :class:`~trainvitals.server.writer.Writer`
thread, reads in FastAPI's thread pool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, Table, and_, case, func, select, update
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement

from trainvitals.lifecycle import ALIVE, End, Event, Hello, Progress, Silent, Stall, moves
from trainvitals.protocol import AnyColumns, ArrayColumns, Columns, EndReason, RunStatus
from trainvitals.server.storage.schema import (
    alerts,
    chunks,
    connect,
    create_schema,
    database_url,
    dialect_insert,
    events,
    outbox,
    runs,
    series,
    silences,
)

#: A new run joins the newest job of its project and key while one of that job's runs is
#: running or stalled, or when the job's newest run started at most this long before it.
JOB_WINDOW = 600.0

ALERT_FIELDS = tuple(c.name for c in alerts.columns)

_PENDING_SERIES = "trainvitals.pending_series"  # in Connection.info: [(run id, [names])]

RUN_FIELDS = (
    "id", "project", "name", "status", "started_at", "ended_at", "last_step", "last_seen",
    "host", "pid", "end_reason", "job_id", "worker",
)  # fmt: skip


def _values(statuses: Iterable[RunStatus]) -> list[str]:
    return [status.value for status in statuses]


def _moved(event: Event, when: ColumnElement[bool] | None = None) -> ColumnElement[Any]:
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


@dataclass(frozen=True)
class RunEnd:
    """How a run ended; its status follows from the reason (:mod:`trainvitals.lifecycle`)."""

    reason: str
    ended_at: float
    traceback: str | None


class Store:
    """Runs and series in one database. ``Store("runs.db")`` or ``Store("postgresql://...")``."""

    def __init__(self, db: str) -> None:
        self.url = database_url(db)
        self.engine = connect(self.url)
        self.dialect = self.engine.dialect.name
        self._insert_chunks = self._insert_ignore(chunks)
        self._insert_series = self._insert_ignore(series)
        # Run id -> the series names this process has committed for it: a frame's known
        # series need no insert. Forgotten when the run ends (a run that speaks again only
        # costs inserts that are ignored).
        self._known_series: dict[str, set[str]] = {}

    def create_schema(self) -> None:
        create_schema(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    def _insert_ignore(self, table: Table) -> Insert:
        return dialect_insert(self.engine, table).on_conflict_do_nothing()

    # -- writes (writer thread) --------------------------------------------------------------

    def open_run(self, conn: Connection, hello: Mapping[str, Any], now: float) -> dict[str, Any]:
        """Create the run if new; a reconnecting run keeps its state. Returns the run row,
        with ``created`` telling which of the two it was."""
        created = conn.execute(
            self._insert_ignore(runs).values(
                id=hello["run_id"],
                project=hello["project"],
                name=hello["name"],
                status=RunStatus.RUNNING.value,
                started_at=hello["started_at"],
                last_seen=now,
                last_seq=0,
                host=hello["host"],
                pid=hello["pid"],
                config=json.dumps(hello["config"]),
                env=json.dumps(hello["env"]),
            )
        ).rowcount
        # A run given up as lost that speaks again is alive after all.
        conn.execute(
            update(runs)
            .where(runs.c.id == hello["run_id"], runs.c.status.in_(_values(moves(Hello()))))
            .values(status=_moved(Hello()), end_reason=None, ended_at=None, last_seen=now)
        )
        if created and hello.get("job"):
            self._join_job(conn, hello)
        row = conn.execute(select(runs).where(runs.c.id == hello["run_id"])).mappings().one()
        return {**row, "created": bool(created)}

    def _join_job(self, conn: Connection, hello: Mapping[str, Any]) -> None:
        """Link a new run to its job: the newest one of the same project and key while it
        still runs or started together with this run, else a new job."""
        job = hello["job"]
        newest = conn.execute(
            select(runs.c.job_id)
            .where(
                runs.c.project == hello["project"],
                runs.c.job_key == job["key"],
                runs.c.id != hello["run_id"],
                runs.c.job_id.is_not(None),
            )
            .order_by(runs.c.started_at.desc())
            .limit(1)
        ).scalar()
        job_id = None
        if newest is not None:
            alive = case((runs.c.status.in_(_values(ALIVE)), 1), else_=0)
            running, latest = conn.execute(
                select(func.sum(alive), func.max(runs.c.started_at)).where(
                    runs.c.job_id == newest, runs.c.id != hello["run_id"]
                )
            ).one()
            if running or hello["started_at"] - latest <= JOB_WINDOW:
                job_id = newest
        job_id = job_id or uuid.uuid4().hex[:16]
        conn.execute(
            update(runs)
            .where(runs.c.id == hello["run_id"])
            .values(job_id=job_id, job_key=job["key"], worker=job["worker"])
        )

    def touch(self, conn: Connection, run_id: str, now: float) -> None:
        """The run is alive (a heartbeat)."""
        conn.execute(update(runs).where(runs.c.id == run_id).values(last_seen=now))

    def mark_lost(self, conn: Connection, run_id: str, now: float) -> dict[str, Any] | None:
        """Give up on a running run that went silent; returns its summary, or None when it
        is not running any more."""
        self._known_series.pop(run_id, None)
        changed = conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.status.in_(_values(moves(Silent()))))
            .values(
                status=_moved(Silent()),
                end_reason=EndReason.HEARTBEAT_LOST.value,
                ended_at=runs.c.last_seen,
            )
        ).rowcount
        if not changed:
            return None
        row = conn.execute(select(*(runs.c[f] for f in RUN_FIELDS)).where(runs.c.id == run_id))
        return dict(row.mappings().one())

    def running_runs(self) -> dict[str, float]:
        """``{run id: last seen}`` of every run still marked running or stalled."""
        query = select(runs.c.id, runs.c.last_seen).where(runs.c.status.in_(_values(ALIVE)))
        with self.engine.connect() as conn:
            return {run_id: last_seen for run_id, last_seen in conn.execute(query)}

    def add_points(
        self, conn: Connection, run_id: str, seq: int, points: Mapping[str, AnyColumns], now: float
    ) -> int | None:
        """Store one frame's points; returns the highest step in it (None when empty)."""
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
            conn.execute(self._insert_chunks, rows)
            known = self._known_series.get(run_id, ())
            new = [r["series"] for r in rows if r["series"] not in known]
            if new:
                conn.execute(self._insert_series, [{"run_id": run_id, "name": n} for n in new])
                # Remembered once committed (see ``committed``): a rolled-back insert must be
                # made again when the frame is replayed.
                conn.info.setdefault(_PENDING_SERIES, []).append((run_id, new))
        changes: dict[str, Any] = {"last_seq": seq, "last_seen": now}
        if last_step is not None:
            # Only a step beyond the stored last one is progress (see trainvitals.lifecycle):
            # the per-second samples filed under the latest step do not end a stall.
            advanced = func.coalesce(runs.c.last_step, -1) < last_step
            changes["status"] = _moved(Progress(last_step), advanced)
            larger = func.greatest if self.dialect == "postgresql" else func.max
            changes["last_step"] = larger(func.coalesce(runs.c.last_step, last_step), last_step)
        conn.execute(
            update(runs).where(runs.c.id == run_id, runs.c.last_seq < seq).values(**changes)
        )
        return last_step

    def mark_stalled(
        self, conn: Connection, run_id: str, seq: int, when: float, report: str
    ) -> None:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.last_seq < seq)
            .values(
                last_seq=seq,
                last_seen=when,
                stalled_at=when,
                stall_stacks=report,
                status=_moved(Stall()),
            )
        )

    def committed(self, conn: Connection) -> None:
        """The transaction on ``conn`` was committed: remember the series it stored."""
        for run_id, names in conn.info.pop(_PENDING_SERIES, ()):
            self._known_series.setdefault(run_id, set()).update(names)

    def rolled_back(self, conn: Connection) -> None:
        """The transaction on ``conn`` failed: what it stored is not there."""
        conn.info.pop(_PENDING_SERIES, None)

    def end_run(self, conn: Connection, run_id: str, seq: int, end: RunEnd) -> None:
        self._known_series.pop(run_id, None)
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.last_seq < seq)
            .values(
                last_seq=seq,
                last_seen=end.ended_at,
                status=_moved(End(end.reason)),
                end_reason=end.reason,
                ended_at=end.ended_at,
                traceback=end.traceback,
            )
        )

    def add_event(
        self,
        conn: Connection,
        run_id: str,
        seq: int,
        kind: str,
        step: int,
        when: float,
        data: Mapping[str, Any],
    ) -> None:
        conn.execute(
            self._insert_ignore(events).values(
                run_id=run_id, seq=seq, kind=kind, step=step, time=when, data=json.dumps(data)
            )
        )
        conn.execute(
            update(runs).where(runs.c.id == run_id, runs.c.last_seq < seq).values(last_seq=seq)
        )

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        query = select(events).where(events.c.run_id == run_id).order_by(events.c.seq)
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        for row in rows:
            row["data"] = json.loads(row["data"])
            row.pop("run_id")
        return rows

    def save_alert(self, conn: Connection, alert: Mapping[str, Any]) -> None:
        """Insert or update an alert (the whole row: the alert book holds the truth)."""
        row = {f: alert[f] for f in ALERT_FIELDS}
        row["evidence"] = json.dumps(alert["evidence"], allow_nan=False)
        statement = dialect_insert(self.engine, alerts).values(**row)
        changed = {f: statement.excluded[f] for f in ALERT_FIELDS if f != "id"}
        conn.execute(statement.on_conflict_do_update(index_elements=["id"], set_=changed))

    def acknowledge(
        self, conn: Connection, alert_id: str, when: float, by: str | None
    ) -> dict[str, Any] | None:
        conn.execute(
            update(alerts)
            .where(alerts.c.id == alert_id)
            .values(acknowledged_at=when, acknowledged_by=by)
        )
        return _alert_row(conn, alert_id)

    def add_silence(self, conn: Connection, silence: Mapping[str, Any]) -> None:
        conn.execute(silences.insert().values(**silence))
        conn.execute(
            update(alerts)
            .where(
                alerts.c.run_id == silence["run_id"],
                alerts.c.rule == silence["rule"],
                alerts.c.subject == silence["subject"],
            )
            .values(silenced_until=silence["until"])
        )

    def add_notices(
        self, conn: Connection, notices: list[dict[str, Any]], owner: str, lease_until: float
    ) -> None:
        """Queue notices (``id``, ``channel``, ``alert_id``, ``change``, ``alert``,
        ``created_at``) for delivery by ``owner``."""
        if notices:
            rows = [
                {
                    **n,
                    "alert": json.dumps(n["alert"], allow_nan=False),
                    "state": "pending",
                    "attempts": 0,
                    "owner": owner,
                    "lease_until": lease_until,
                }
                for n in notices
            ]
            conn.execute(outbox.insert(), rows)

    def last_notice_change(self, conn: Connection, alert_id: str, channel: str) -> str | None:
        """The change (``fired``, ``resolved``) of the alert last queued for ``channel``."""
        query = (
            select(outbox.c.change)
            .where(outbox.c.alert_id == alert_id, outbox.c.channel == channel)
            .order_by(outbox.c.created_at.desc())
            .limit(1)
        )
        return conn.execute(query).scalar()

    def claim_notices(
        self, conn: Connection, owner: str, channels: list[str], now: float, lease_until: float
    ) -> list[dict[str, Any]]:
        """Renew ``owner``'s leases, then take over the pending notices of ``channels`` whose
        lease ran out (their server died); returns those taken, oldest first. One
        ``UPDATE ... RETURNING``, so two servers never take the same notice."""
        pending = outbox.c.state == "pending"
        conn.execute(
            update(outbox).where(pending, outbox.c.owner == owner).values(lease_until=lease_until)
        )
        taken = conn.execute(
            update(outbox)
            .where(pending, outbox.c.lease_until < now, outbox.c.channel.in_(channels))
            .values(owner=owner, lease_until=lease_until)
            .returning(*outbox.c)
        ).mappings()
        rows = [{**row, "alert": json.loads(row["alert"])} for row in taken]
        return sorted(rows, key=lambda row: (row["created_at"], row["id"]))

    def release_notices(self, conn: Connection, owner: str) -> None:
        """``owner`` stops: whoever starts next takes its pending notices at once."""
        conn.execute(
            update(outbox)
            .where(outbox.c.state == "pending", outbox.c.owner == owner)
            .values(lease_until=0.0)
        )

    def notice_attempted(self, conn: Connection, ids: list[str], error: str) -> None:
        conn.execute(
            update(outbox)
            .where(outbox.c.id.in_(ids))
            .values(attempts=outbox.c.attempts + 1, last_error=error)
        )

    def notices_done(
        self, conn: Connection, ids: list[str], state: str, when: float, error: str | None = None
    ) -> None:
        """Mark notices ``delivered`` or ``failed`` (given up)."""
        values: dict[str, Any] = {
            "state": state,
            "done_at": when,
            "attempts": outbox.c.attempts + 1,
        }
        if error is not None:
            values["last_error"] = error
        conn.execute(update(outbox).where(outbox.c.id.in_(ids)).values(**values))

    # -- reads (thread pool) -----------------------------------------------------------------

    def notice_summary(self) -> dict[str, dict[str, Any]]:
        """Per channel: how many notices are pending, delivered and failed, when the last
        one was delivered, and the last error."""
        out: dict[str, dict[str, Any]] = {}
        with self.engine.connect() as conn:
            counts = conn.execute(
                select(
                    outbox.c.channel, outbox.c.state, func.count(), func.max(outbox.c.done_at)
                ).group_by(outbox.c.channel, outbox.c.state)
            )
            for channel, state, count, done in counts:
                summary = out.setdefault(
                    channel,
                    {"pending": 0, "delivered": 0, "failed": 0, "last_delivered_at": None},
                )
                summary[state] = count
                if state == "delivered":
                    summary["last_delivered_at"] = done
            for channel, summary in out.items():
                summary["last_error"] = conn.execute(
                    select(outbox.c.last_error)
                    .where(outbox.c.channel == channel, outbox.c.last_error.is_not(None))
                    .order_by(outbox.c.created_at.desc())
                    .limit(1)
                ).scalar()
        return out

    def list_notices(self, alert_id: str) -> list[dict[str, Any]]:
        """The notices of one alert, oldest first (what was sent where, and how it went)."""
        query = (
            select(outbox)
            .where(outbox.c.alert_id == alert_id)
            .order_by(outbox.c.created_at, outbox.c.id)
        )
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        for row in rows:
            row.pop("alert")
        return rows

    def list_runs(
        self, limit: int = 500, project: str | None = None, job: str | None = None
    ) -> list[dict[str, Any]]:
        query = select(*(runs.c[f] for f in RUN_FIELDS)).order_by(runs.c.started_at.desc())
        if project is not None:
            query = query.where(runs.c.project == project)
        if job is not None:
            query = query.where(runs.c.job_id == job)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query.limit(limit)).mappings()]

    def get_run(self, run_id: str, job: bool = True) -> dict[str, Any] | None:
        """One run with its series names and (``job``) its job's runs."""
        with self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).mappings().first()
            if row is None:
                return None
            names = conn.execute(
                select(series.c.name).where(series.c.run_id == run_id).order_by(series.c.name)
            ).scalars()
            run = dict(row)
            run["series"] = list(names)
            if job and run["job_id"]:
                run["job"] = self._job(conn, run["job_id"])
        run["config"] = json.loads(run["config"])
        run["env"] = json.loads(run["env"])
        run.pop("last_seq")
        return run

    def _job(self, conn: Connection, job_id: str) -> dict[str, Any]:
        """A job and its runs, in worker order (chief first, then by type and index)."""
        fields = ("id", "name", "worker", "status", "started_at", "last_step", "last_seen", "host")
        members = [
            dict(r)
            for r in conn.execute(
                select(*(runs.c[f] for f in fields)).where(runs.c.job_id == job_id)
            ).mappings()
        ]
        members.sort(key=lambda m: worker_order(m["worker"]))
        return {"id": job_id, "runs": members}

    def list_alerts(
        self,
        run_id: str | None = None,
        state: str | None = None,
        project: str | None = None,
        severity: str | None = None,
        limit: int = 500,
    ) -> list[dict[str, Any]]:
        """Alerts, newest first."""
        query = select(alerts).order_by(alerts.c.time.desc(), alerts.c.id).limit(limit)
        for column, value in (
            (alerts.c.run_id, run_id),
            (alerts.c.state, state),
            (alerts.c.project, project),
            (alerts.c.severity, severity),
        ):
            if value is not None:
                query = query.where(column == value)
        with self.engine.connect() as conn:
            return [_alert(row) for row in conn.execute(query).mappings()]

    def get_alert(self, alert_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            return _alert_row(conn, alert_id)

    def active_silences(self, now: float) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(silences).where(silences.c.until > now)).mappings()
            return [dict(r) for r in rows]

    def last_values(self, run_id: str, prefixes: tuple[str, ...]) -> dict[str, float]:
        """The last stored value of each of the run's series whose name starts with one of
        ``prefixes`` (the readings just before a run ended)."""
        out: dict[str, float] = {}
        with self.engine.connect() as conn:
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

    def recent_points(self, run_id: str, frames: int) -> dict[str, ArrayColumns]:
        """The points of the run's last ``frames`` frames, per series, in frame order: the
        history the alert engine replays to rebuild its state after a restart."""
        with self.engine.connect() as conn:
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
        return {
            name: Columns(
                np.frombuffer(b"".join(p[0] for p in chunk), dtype=np.int64),
                np.frombuffer(b"".join(p[1] for p in chunk), dtype=np.float64),
                np.frombuffer(b"".join(p[2] for p in chunk), dtype=np.float64),
            )
            for name, chunk in parts.items()
        }

    def read_series(self, run_id: str, name: str) -> ArrayColumns:
        """Every point of one series, ordered by step."""
        query = (
            select(chunks.c.steps, chunks.c.times, chunks.c.vals)
            .where(chunks.c.run_id == run_id, chunks.c.series == name)
            .order_by(chunks.c.seq)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return Columns(np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.float64))
        steps = np.frombuffer(b"".join(r[0] for r in rows), dtype=np.int64)
        times = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float64)
        values = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float64)
        if steps.size > 1 and np.any(steps[1:] < steps[:-1]):
            order = np.argsort(steps, kind="stable")
            steps, times, values = steps[order], times[order], values[order]
        return Columns(steps, times, values)


def worker_order(worker: str | None) -> tuple[int, str, int, str]:
    """Sort key of worker names: ``chief`` and ``master`` first, then by type, then by
    index (``worker:2`` before ``worker:10``)."""
    kind, _, index = (worker or "").rpartition(":")
    if not kind:
        kind, index = index, ""
    number = int(index) if index.isdigit() else -1
    return (0 if kind in ("chief", "master") else 1, kind, number, worker or "")


def _alert(row: Any) -> dict[str, Any]:
    alert = dict(row)
    alert["evidence"] = json.loads(alert["evidence"])
    return alert


def _alert_row(conn: Connection, alert_id: str) -> dict[str, Any] | None:
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).mappings().first()
    return None if row is None else _alert(row)
