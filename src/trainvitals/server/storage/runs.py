"""Runs, the jobs they belong to, and their kept events: the ``runs`` and ``events`` tables.

What a run is read as: :mod:`~trainvitals.server.storage.run_rows`; which runs a list or
retention reads: :mod:`~trainvitals.server.storage.run_queries`. Every status change is one of
the run lifecycle's moves, made in the database
(:mod:`~trainvitals.server.storage.run_moves`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Connection, Engine, and_, case, func, select, true, update
from sqlalchemy.sql.elements import ColumnElement

from trainvitals.protocol import EndReason, RunStatus
from trainvitals.server.run_lifecycle import ALIVE, End, Hello, Silent, Stall, moves
from trainvitals.server.settings import Retention
from trainvitals.server.storage.run_moves import moved_status, status_values
from trainvitals.server.storage.run_queries import (
    METRIC_STATS,
    RunFilter,
    archived_past,
    filter_conditions,
    metric_summaries,
    read_job,
)
from trainvitals.server.storage.run_rows import (
    ListedRun,
    OpenedRun,
    RunDetail,
    RunEdit,
    RunEnd,
    RunEvent,
    RunPage,
    RunRow,
    RunSummary,
    run_summary,
)
from trainvitals.server.storage.schema import alerts, dialect_insert, events, runs, series
from trainvitals.server.storage.unit_of_work import UnitOfWork

#: A new run joins the newest job of its project and key while one of that job's runs is
#: running or stalled, or when the job's newest run started at most this long before it.
JOB_WINDOW = 600.0
#: A run's summary as this module reads it.
_SUMMARY = [runs.c[field] for field in RunSummary.__annotations__]
#: A run's row as this module reads it: the storage's own columns (the secret's hash, how far
#: the compactor has gone) are left out.
_ROW = [runs.c[field] for field in RunRow.__annotations__]


class RunStore:
    """The ``runs`` and ``events`` tables.

    Args:
        engine: the database.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._insert_run = dialect_insert(engine, runs).on_conflict_do_nothing()
        self._insert_event = dialect_insert(engine, events).on_conflict_do_nothing()

    # -- writes (writer thread) --------------------------------------------------------------

    def open_run(self, work: UnitOfWork, hello: Mapping[str, Any], now: float) -> OpenedRun:
        """Create the run if new; a reconnecting run keeps its state. Returns the run row,
        with ``created`` telling which of the two it was.

        A new run is bound to a secret: the one its first hello carries (``run_secret``: the
        agent makes one, so its watchdog knows it from the start), else one issued here and
        returned once, in ``secret``, for the welcome. A hello for an existing run must carry
        it, else nothing changes and ``owned`` is False: no other client can take a run over.
        Nor can a hello move a run to another project (its token may send runs of that one
        only): one naming another project than the run's changes nothing either."""
        conn = work.connection()
        claimed = hello.get("run_secret")
        stored = conn.execute(
            select(runs.c.secret_hash, runs.c.project).where(runs.c.id == hello["run_id"])
        ).first()
        if stored is not None and (
            stored.project != hello["project"]
            or (
                stored.secret_hash is not None
                and (not claimed or not hmac.compare_digest(stored.secret_hash, _digest(claimed)))
            )
        ):
            theirs = conn.execute(select(*_ROW).where(runs.c.id == hello["run_id"]))
            refused = {**theirs.mappings().one(), "created": False, "owned": False}
            return cast(OpenedRun, {**refused, "secret": None})
        bound = stored is not None and stored.secret_hash is not None
        issued = None if bound or claimed else secrets.token_urlsafe(24)
        binding = None if bound else _digest(claimed or issued or "")
        created = (
            conn.execute(
                self._insert_run.values(
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
                    secret_hash=binding,
                    process_key=(hello.get("process") or {}).get("key"),
                )
                # RETURNING, not rowcount: PostgreSQL's driver reports -1 for ON CONFLICT DO
                # NOTHING, which took every reconnect for a new run.
                .returning(runs.c.id)
            ).first()
            is not None
        )
        if binding and not created:  # a run from before secrets: bound from now on
            conn.execute(
                update(runs).where(runs.c.id == hello["run_id"]).values(secret_hash=binding)
            )
        # A run given up as lost that speaks again is alive after all.
        conn.execute(
            update(runs)
            .where(runs.c.id == hello["run_id"], runs.c.status.in_(status_values(moves(Hello()))))
            .values(status=moved_status(Hello()), end_reason=None, ended_at=None, last_seen=now)
        )
        if created and hello.get("job"):
            _join_job(conn, hello)
        row = conn.execute(select(*_ROW).where(runs.c.id == hello["run_id"])).mappings().one()
        return cast(OpenedRun, {**row, "created": bool(created), "owned": True, "secret": issued})

    def revive(self, work: UnitOfWork, run_id: str, now: float) -> bool:
        """A run given up as lost is heard again: running, its ending cleared."""
        conn = work.connection()
        return bool(
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.status.in_(status_values(moves(Hello()))))
                .values(status=moved_status(Hello()), end_reason=None, ended_at=None, last_seen=now)
            ).rowcount
        )

    def touch(self, work: UnitOfWork, run_id: str, now: float) -> None:
        """The run is alive (a heartbeat)."""
        conn = work.connection()
        conn.execute(update(runs).where(runs.c.id == run_id).values(last_seen=now))

    def mark_lost(self, work: UnitOfWork, run_id: str, now: float) -> RunSummary | None:
        """Give up on a running run that went silent; returns its summary, or None when it
        is not running any more."""
        conn = work.connection()
        changed = conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.status.in_(status_values(moves(Silent()))))
            .values(
                status=moved_status(Silent()),
                end_reason=EndReason.HEARTBEAT_LOST.value,
                ended_at=runs.c.last_seen,
            )
        ).rowcount
        if not changed:
            return None
        row = conn.execute(select(*_SUMMARY).where(runs.c.id == run_id)).mappings().one()
        return run_summary(dict(row))

    def mark_stalled(
        self, work: UnitOfWork, run_id: str, seq: int, when: float, report: str
    ) -> None:
        conn = work.connection()
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.last_seq < seq)
            .values(
                last_seq=seq,
                last_seen=when,
                stalled_at=when,
                stall_stacks=report,
                status=moved_status(Stall()),
            )
        )

    def end_run(self, work: UnitOfWork, run_id: str, seq: int, end: RunEnd) -> None:
        conn = work.connection()
        event = End(end.reason)
        new = runs.c.last_seq < seq
        # The ending is written only where the lifecycle lets the run end: a finished or
        # crashed run keeps how it ended, whatever a late end frame says. Its number is not
        # asked: a stored end leaves the run finished or crashed, so an end that finds the
        # run alive is no replay, even where a frame stored first took its number (a killed
        # process's watchdog numbered after a stale welcome: docs/protocol.md).
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.status.in_(status_values(moves(event))))
            .values(
                status=moved_status(event),
                end_reason=end.reason,
                ended_at=end.ended_at,
                traceback=end.traceback,
            )
        )
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id, new)
            .values(last_seq=seq, last_seen=end.ended_at)
        )

    def add_event(
        self,
        work: UnitOfWork,
        run_id: str,
        seq: int,
        kind: str,
        step: int,
        when: float,
        data: Mapping[str, Any],
    ) -> None:
        conn = work.connection()
        conn.execute(
            self._insert_event.values(
                run_id=run_id, seq=seq, kind=kind, step=step, time=when, data=json.dumps(data)
            )
        )
        conn.execute(
            update(runs).where(runs.c.id == run_id, runs.c.last_seq < seq).values(last_seq=seq)
        )

    # -- reads (thread pool) -----------------------------------------------------------------

    def running_runs(self) -> dict[str, float]:
        """``{run id: last seen}`` of every run still marked running or stalled."""
        query = select(runs.c.id, runs.c.last_seen).where(runs.c.status.in_(status_values(ALIVE)))
        with self._engine.connect() as conn:
            return {run_id: last_seen for run_id, last_seen in conn.execute(query)}

    def count_by_status(self) -> dict[str, int]:
        """``{status: runs}`` (for ``GET /metrics``)."""
        query = select(runs.c.status, func.count()).group_by(runs.c.status)
        with self._engine.connect() as conn:
            return {status: int(count) for status, count in conn.execute(query)}

    def list_runs(
        self,
        limit: int = 500,
        project: str | None = None,
        job: str | None = None,
        status: RunStatus | None = None,
    ) -> list[RunSummary]:
        """Runs, newest first; ``job``: only the runs of that job; ``status``: only those
        in that status."""
        statuses = (status.value,) if status is not None else ()
        which = RunFilter(project=project, job=job, status=statuses, archived="include")
        return list(self.find_runs(which, limit)["runs"])

    def projects(self, only: str | None = None) -> list[str]:
        """The projects that have a run (archived ones too), sorted; ``only``: that one, if
        it has."""
        query = select(runs.c.project).distinct().order_by(runs.c.project)
        if only is not None:
            query = query.where(runs.c.project == only)
        with self._engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def find_runs(
        self,
        which: RunFilter,
        limit: int = 50,
        offset: int = 0,
        config_keys: tuple[str, ...] = (),
        metrics: tuple[str, ...] = (),
    ) -> RunPage:
        """A page of the runs ``which`` selects, and their number; each run carries the
        values of ``config_keys`` in ``config``, and the summaries of its series named in
        ``metrics`` in ``metrics``, when some are asked for."""
        where = filter_conditions(which)
        stat, _, metric = which.sort.partition(":")
        source: Any = runs
        if metric:
            by = series.alias("sorted_by")
            source = runs.outerjoin(by, and_(by.c.run_id == runs.c.id, by.c.name == metric))
            key = by.c[METRIC_STATS[stat]]
        else:
            key = runs.c[which.sort]
        order = key.desc() if which.descending else key.asc()
        columns = [*_SUMMARY, runs.c.config] if config_keys else _SUMMARY
        query = (
            select(*columns)
            .select_from(source)
            .where(*where)
            # Ties newest first, then by id, so that pages neither skip nor repeat a run.
            .order_by(order.nulls_last(), runs.c.started_at.desc(), runs.c.id.desc())
            .limit(limit)
            .offset(offset)
        )
        with self._engine.connect() as conn:
            total = conn.execute(select(func.count()).select_from(runs).where(*where)).scalar()
            rows = [dict(r) for r in conn.execute(query).mappings()]
            summaries = metric_summaries(conn, [row["id"] for row in rows], metrics)
        page: list[ListedRun] = []
        for row in rows:
            listed = cast(ListedRun, run_summary(row))
            if config_keys:
                config = json.loads(row["config"] or "{}")
                listed["config"] = {k: config[k] for k in config_keys if k in config}
            if metrics:
                listed["metrics"] = summaries.get(row["id"], {})
            page.append(listed)
        return RunPage(runs=page, total=int(total or 0))

    def edit_run(
        self, work: UnitOfWork, run_id: str, edit: RunEdit, now: float
    ) -> RunSummary | None:
        """Rename, tag, note or archive a run; its alerts follow a new name. A run archived
        now is ``archived_at`` now (archiving it again keeps the first time; bringing it back
        clears it). Returns the run's summary, or None when there is no such run."""
        conn = work.connection()
        values: dict[str, str | bool | ColumnElement[Any] | None] = {}
        if "name" in edit:
            values["name"] = edit["name"]
        if "notes" in edit:
            values["notes"] = edit["notes"]
        if "tags" in edit:
            values["tags"] = json.dumps(edit["tags"])
        if "archived" in edit:
            values["archived"] = edit["archived"]
            already = runs.c.archived == true()
            since = case((already, func.coalesce(runs.c.archived_at, now)), else_=now)
            values["archived_at"] = since if edit["archived"] else None
        if values:
            conn.execute(update(runs).where(runs.c.id == run_id).values(**values))
        if "name" in edit:
            conn.execute(
                update(alerts).where(alerts.c.run_id == run_id).values(run_name=edit["name"])
            )
        row = conn.execute(select(*_SUMMARY).where(runs.c.id == run_id)).mappings().first()
        return None if row is None else run_summary(dict(row))

    def archived_to_delete(self, now: float, after_days: Retention, limit: int = 100) -> list[str]:
        """Ended runs archived longer ago than their project's days, oldest first."""
        due = archived_past(now, after_days)
        if due is None:
            return []
        query = select(runs.c.id).where(due).order_by(runs.c.archived_at).limit(limit)
        with self._engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def get_run(self, run_id: str, *, job: bool = True, metrics: bool = True) -> RunDetail | None:
        """One run with its series names, (``metrics``) their summaries, and (``job``) its
        job's runs."""
        with self._engine.connect() as conn:
            row = conn.execute(select(*_ROW).where(runs.c.id == run_id)).mappings().first()
            if row is None:
                return None
            names = conn.execute(
                select(series.c.name).where(series.c.run_id == run_id).order_by(series.c.name)
            ).scalars()
            run = dict(row)
            run["series"] = list(names)
            run["metrics"] = metric_summaries(conn, [run_id]).get(run_id, {}) if metrics else {}
            if job and run["job_id"]:
                run["job"] = read_job(conn, run["job_id"])
        run["config"] = json.loads(run["config"])
        run["env"] = json.loads(run["env"])
        run.update(run_summary(run))  # tags, notes and archived as the list gives them
        run.pop("last_seq")
        return cast(RunDetail, run)

    def run_events(self, run_id: str) -> list[RunEvent]:
        """The run's kept events, in the order they came."""
        query = select(events).where(events.c.run_id == run_id).order_by(events.c.seq)
        with self._engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        for row in rows:
            row["data"] = json.loads(row["data"])
            row.pop("run_id")
        return cast(list[RunEvent], rows)


def lock_run(conn: Connection, run_id: str) -> None:
    """Hold the run's row lock until the transaction ends, on PostgreSQL (SQLite has one
    writer anyway): the compactor, the thinner and a deletion of the run take it, so that
    no block or clock is written beside another replica's change of the same run."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(runs.c.id).where(runs.c.id == run_id).with_for_update())


def _join_job(conn: Connection, hello: Mapping[str, Any]) -> None:
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
        alive = case((runs.c.status.in_(status_values(ALIVE)), 1), else_=0)
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


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
