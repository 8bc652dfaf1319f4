"""Runs, the jobs they belong to, and their kept events.

Every status change is one of the run lifecycle's moves
(:func:`trainvitals.server.run_lifecycle.moves`), made in the database by :func:`_moved`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    NotRequired,  # pydantic reads these on 3.11
    cast,
)

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    and_,
    bindparam,
    case,
    false,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement
from typing_extensions import TypedDict

from trainvitals.protocol import EndReason, RunStatus
from trainvitals.server.run_lifecycle import (
    ALIVE,
    End,
    Event,
    Hello,
    Progress,
    Silent,
    Stall,
    moves,
)
from trainvitals.server.settings import Retention
from trainvitals.server.storage.schema import alerts, dialect_insert, events, runs, series

if TYPE_CHECKING:  # only a type here; imported, it closes a cycle (unit_of_work, runs)
    from trainvitals.server.storage.unit_of_work import UnitOfWork

#: A new run joins the newest job of its project and key while one of that job's runs is
#: running or stalled, or when the job's newest run started at most this long before it.
JOB_WINDOW = 600.0
#: Seconds in a day (retention is set in days).
DAY = 86400.0


class RunSummary(TypedDict):
    """A run as the run list and browsers see it."""

    id: str
    project: str
    name: str
    status: str  # a RunStatus value
    started_at: float
    ended_at: float | None
    last_step: int | None
    last_seen: float
    host: str
    pid: int
    end_reason: str | None
    job_id: str | None
    worker: str | None
    #: The training process that made it: the runs of one loop of fits share it.
    process_key: str | None
    tags: list[str]
    notes: str
    archived: bool


_SUMMARY = [runs.c[field] for field in RunSummary.__annotations__]

#: The runs list's sort keys (``GET /api/v1/runs?sort=``), besides a series' statistic.
SORTS = ("started_at", "name", "project", "status", "last_step", "last_seen", "host", "ended_at")
#: A series' statistics the runs list sorts by (``sort=min:val_loss``), and their columns.
METRIC_STATS = {"last": "last_value", "min": "min_value", "max": "max_value"}


@dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows, in what order.

    Attributes:
        project: only that project's runs; job: only that job's workers; process: only the
            runs that process made.
        q: part of the name (case-insensitive); status: one of them; tag: runs with that tag.
        archived: ``hide`` (the default), ``only`` or ``include`` the archived runs.
        health: the worst alert the run raised, firing or not: ``critical``, ``warning``, or
            ``healthy`` (no warning or critical alert).
        sort: one of :data:`SORTS`, or a series' statistic, ``last:NAME``, ``min:NAME`` or
            ``max:NAME`` (see :data:`METRIC_STATS`; runs without that series, or without a
            finite value of it, come last either way); descending: its order.
    """

    project: str | None = None
    job: str | None = None
    process: str | None = None
    q: str | None = None
    status: tuple[str, ...] = ()
    tag: str | None = None
    archived: str = "hide"
    health: str | None = None
    sort: str = "started_at"
    descending: bool = True


class MetricSummary(TypedDict):
    """A series of a run at a glance: ``last``, its value at ``step``, its highest step (null
    when NaN or ±Inf, which ``nonfinite`` then names: ``nan``, ``inf``, ``-inf``); ``min`` and
    ``max``, its least and greatest finite values (null when it has none)."""

    step: int
    last: float | None
    min: float | None
    max: float | None
    nonfinite: NotRequired[str]


class ListedRun(RunSummary):
    """A run in the runs list: its summary, and the config values and series asked for."""

    config: NotRequired[dict[str, Any]]
    metrics: NotRequired[dict[str, MetricSummary]]


class RunPage(TypedDict):
    """One page of the runs list and how many runs match in all."""

    runs: list[ListedRun]
    total: int


class RunEdit(TypedDict, total=False):
    """What people may change of a run (``PATCH /api/v1/runs/{id}``)."""

    name: str
    tags: list[str]
    notes: str
    archived: bool


class _RunEnding(RunSummary):
    """How the run ended or stalled, and the key of its job."""

    traceback: str | None
    stalled_at: float | None
    stall_stacks: str | None
    job_key: str | None


class RunRow(_RunEnding):
    """One row of the ``runs`` table."""

    last_seq: int  # the last agent frame stored
    config: str  # JSON
    env: str  # JSON


#: A run's row as this module reads it: the storage's own columns (the secret's hash, how far
#: the compactor has gone) are left out.
_ROW = [runs.c[field] for field in RunRow.__annotations__]


class OpenedRun(RunRow):
    """The row of a run that said hello."""

    created: bool  # a new run (else one reconnecting)
    #: False when the hello did not prove the run's secret: nothing was changed.
    owned: bool
    #: A secret issued now (to a new run, or an older one that had none), for the welcome.
    secret: str | None


class JobMember(TypedDict):
    """One run of a job."""

    id: str
    name: str
    worker: str | None
    status: str
    started_at: float
    last_step: int | None
    last_seen: float
    host: str


class Job(TypedDict):
    """A job of several processes: its runs, in worker order (chief first)."""

    id: str
    runs: list[JobMember]


class RunDetail(_RunEnding):
    """One run with everything the API tells of it."""

    config: dict[str, Any]
    env: dict[str, Any]
    series: list[str]  # the names of its series
    #: Each of its series' summary, by name (those with a point).
    metrics: dict[str, MetricSummary]
    job: NotRequired[Job]


class RunEvent(TypedDict):
    """A kept agent frame (an autopsy)."""

    """How a run ended; its status follows from the reason (:mod:`~.run_lifecycle`)."""
    kind: str
    step: int
    time: float
    data: dict[str, Any]


@dataclass(frozen=True)
class RunEnd:
    """How a run ended; its status follows from the reason
    (:mod:`trainvitals.server.run_lifecycle`)."""

    reason: str
    ended_at: float
    traceback: str | None


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
            .where(runs.c.id == hello["run_id"], runs.c.status.in_(_values(moves(Hello()))))
            .values(status=_moved(Hello()), end_reason=None, ended_at=None, last_seen=now)
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
                .where(runs.c.id == run_id, runs.c.status.in_(_values(moves(Hello()))))
                .values(status=_moved(Hello()), end_reason=None, ended_at=None, last_seen=now)
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
            .where(runs.c.id == run_id, runs.c.status.in_(_values(moves(Silent()))))
            .values(
                status=_moved(Silent()),
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
                status=_moved(Stall()),
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
            .where(runs.c.id == run_id, runs.c.status.in_(_values(moves(event))))
            .values(
                status=_moved(event),
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
        query = select(runs.c.id, runs.c.last_seen).where(runs.c.status.in_(_values(ALIVE)))
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
        where = _conditions(which)
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
            summaries = _metric_summaries(conn, [row["id"] for row in rows], metrics)
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
        values: dict[str, Any] = dict(edit)
        if "tags" in edit:
            values["tags"] = json.dumps(edit["tags"])
        if "archived" in edit:
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
            run["metrics"] = _metric_summaries(conn, [run_id]).get(run_id, {}) if metrics else {}
            if job and run["job_id"]:
                run["job"] = _job(conn, run["job_id"])
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
    them, on the driver's connection (run as the transaction commits, when SQLAlchemy's is
    committing). A frame's update, made and sent alone, took more time than storing its
    points."""
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
def _progress(dialect: Dialect, stepped: bool) -> tuple[str, dict[str, Any], list[str] | None]:
    """:func:`write_progress`'s statement as the driver takes it, compiled once: its SQL, the
    values of its constant parameters (the statuses :func:`_moved` compares with), and the
    order of the parameters where they are positional (None: by name)."""
    seq = bindparam("seq", type_=BigInteger)
    changes: dict[str, Any] = {"last_seq": seq, "last_seen": bindparam("now", type_=Float)}
    if stepped:
        # Only a step beyond the stored last one is progress (see trainvitals.server.run_lifecycle):
        # the per-second samples filed under the latest step do not end a stall.
        step = bindparam("step", type_=BigInteger)
        advanced = func.coalesce(runs.c.last_step, -1) < step
        changes["status"] = _moved(Progress(0), advanced)
        larger = func.greatest if dialect.name == "postgresql" else func.max
        changes["last_step"] = larger(func.coalesce(runs.c.last_step, step), step)
    where = (runs.c.id == bindparam("run_id"), runs.c.last_seq < seq)
    compiled = update(runs).where(*where).values(**changes).compile(dialect=dialect)
    placeholders = {"run_id": "", "seq": 0, "now": 0.0, "step": 0}
    every = compiled.construct_params(placeholders)
    constants = {k: v for k, v in every.items() if k not in placeholders}
    order = None if compiled.positiontup is None else list(compiled.positiontup)
    return compiled.string, constants, order


def past_days(
    after_days: Retention, column: ColumnElement[Any], now: float
) -> ColumnElement[bool] | None:
    """Whether ``column`` (a time) lies further back than the run's project's days in
    ``after_days``, as SQL; None when the policy reaches no project."""
    old = [
        and_(runs.c.project == project, column < now - days * DAY)
        for project, days in after_days.projects.items()
        if days > 0
    ]
    if after_days.default is not None:
        others = runs.c.project.not_in(list(after_days.projects))
        old.append(and_(others, column < now - after_days.default * DAY))
    return or_(*old) if old else None


def archived_past(now: float, after_days: Retention) -> ColumnElement[bool] | None:
    """Runs that have ended, archived longer ago than their project's days, as SQL (None:
    none can be). A running run is never among them: its agent would write it again."""
    old = past_days(after_days, runs.c.archived_at, now)
    if old is None:
        return None
    return and_(
        runs.c.archived == true(),
        runs.c.archived_at.is_not(None),
        runs.c.status.not_in(_values(ALIVE)),
        old,
    )


def worker_order(worker: str | None) -> tuple[int, str, int, str]:
    """Sort key of worker names: ``chief`` and ``master`` first, then by type, then by
    index (``worker:2`` before ``worker:10``)."""
    kind, _, index = (worker or "").rpartition(":")
    if not kind:
        kind, index = index, ""
    number = int(index) if index.isdigit() else -1
    return (0 if kind in ("chief", "master") else 1, kind, number, worker or "")


def run_summary(run: Mapping[str, Any]) -> RunSummary:
    """The summary of a run row (its tags decoded; rows from before them have none)."""
    summary = {field: run.get(field) for field in RunSummary.__annotations__}
    summary["tags"] = json.loads(run.get("tags") or "[]")
    summary["notes"] = run.get("notes") or ""
    summary["archived"] = bool(run.get("archived"))
    return cast(RunSummary, summary)


def _metric_summaries(
    conn: Connection, run_ids: list[str], names: tuple[str, ...] | None = None
) -> dict[str, dict[str, MetricSummary]]:
    """Run id -> series name -> its summary, of those of ``names`` (all when None) each run
    has points of."""
    if not run_ids or names == ():
        return {}
    query = select(
        series.c.run_id,
        series.c.name,
        series.c.last_step,
        series.c.last_value,
        series.c.last_nonfinite,
        series.c.min_value,
        series.c.max_value,
    ).where(series.c.run_id.in_(run_ids), series.c.last_step.is_not(None))
    if names is not None:
        query = query.where(series.c.name.in_(names))
    found: dict[str, dict[str, MetricSummary]] = {}
    for run_id, name, step, last, nonfinite, low, high in conn.execute(query):
        summary = MetricSummary(step=step, last=last, min=low, max=high)
        if nonfinite is not None:
            summary["nonfinite"] = nonfinite
        found.setdefault(run_id, {})[name] = summary
    return found


def _conditions(which: RunFilter) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a :class:`RunFilter`."""
    where: list[ColumnElement[bool]] = []
    if which.project is not None:
        where.append(runs.c.project == which.project)
    if which.job is not None:
        where.append(runs.c.job_id == which.job)
    if which.process is not None:
        where.append(runs.c.process_key == which.process)
    if which.q:
        where.append(func.lower(runs.c.name).contains(which.q.lower(), autoescape=True))
    if which.status:
        where.append(runs.c.status.in_(which.status))
    if which.tag:
        # Tags are stored as a JSON list of strings that hold no quote or backslash.
        where.append(runs.c.tags.contains(json.dumps(which.tag), autoescape=True))
    if which.health is not None:
        where.append(_raised(which.health))
    archived = func.coalesce(runs.c.archived, false())
    if which.archived == "hide":
        where.append(archived == false())
    elif which.archived == "only":
        where.append(archived == true())
    return where


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


def _raised(health: str) -> ColumnElement[bool]:
    """Runs whose worst alert, firing or not, is ``health`` (``healthy``: no warning or
    critical alert)."""

    def any_of(*severities: str) -> ColumnElement[bool]:
        return (
            select(alerts.c.id)
            .where(alerts.c.run_id == runs.c.id, alerts.c.severity.in_(severities))
            .exists()
        )

    if health == "critical":
        return any_of("critical")
    if health == "warning":
        return and_(any_of("warning"), ~any_of("critical"))
    return ~any_of("warning", "critical")


def _job(conn: Connection, job_id: str) -> Job:
    """A job and its runs, in worker order (chief first, then by type and index)."""
    members = [
        cast(JobMember, dict(r))
        for r in conn.execute(
            select(*(runs.c[f] for f in JobMember.__annotations__)).where(runs.c.job_id == job_id)
        ).mappings()
    ]
    members.sort(key=lambda m: worker_order(m["worker"]))
    return Job(id=job_id, runs=members)


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


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
