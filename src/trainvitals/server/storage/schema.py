"""The database's tables, its URL and engine (migrations: :mod:`trainvitals.server.migrations`).

Points are stored for volume: each agent frame becomes one row of ``chunks`` per series,
holding that frame's points as packed arrays (int64 steps, float64 times and values).
Reading a million-point series is then a few thousand rows and one ``numpy.concatenate``,
and the primary key ``(run_id, series, seq)`` makes replayed frames harmless
(insert-or-ignore). Later the compactor (:meth:`SeriesStore.compact
<trainvitals.server.storage.series.SeriesStore.compact>`) merges a series' frames into blocks
of up to 65,536 points in the compact ``encoding`` of :mod:`~trainvitals.server.storage.codec`,
each keyed by the last ``seq`` it holds; ``runs.compacted_seq`` says how far it has gone.
A block's steps and times are kept in ``clocks``, once for every series of the run that has the
very same ones (the per-step series of a run share their steps and times, and so do its system
series), and the block row refers to them by ``chunks.clock``.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Engine,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    create_engine,
    event,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from trainvitals.exceptions import StorageError

metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project", String(200), nullable=False),
    Column("name", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("last_step", BigInteger),
    Column("last_seen", Float, nullable=False),
    Column("last_seq", BigInteger, nullable=False, default=0),
    Column("host", String(255), nullable=False, default=""),
    Column("pid", Integer, nullable=False, default=0),
    Column("end_reason", String(200)),
    Column("traceback", Text),
    Column("stalled_at", Float),
    Column("stall_stacks", Text),
    Column("config", Text, nullable=False, default="{}"),
    Column("env", Text, nullable=False, default="{}"),
    # The job of several processes the run is one worker of (see ``RunStore.open_run``).
    Column("job_id", String(64)),
    Column("job_key", String(128)),
    # SHA-256 of the per-run secret the server issued when the run was made: only the process
    # that holds it may speak for the run again (see ``RunStore.open_run``).
    Column("secret_hash", String(64)),
    Column("worker", String(64)),
    # The training process that made the run (host, pid, start time: the agent's key); the
    # runs one process makes in a loop of fits share it (see ``RunStore.open_run``).
    Column("process_key", String(128)),
    # The frames up to this seq have been compacted (see SeriesStore.compact); NULL: none.
    Column("compacted_seq", BigInteger),
    # When its points were thinned to a min/max summary (SeriesStore.thin); NULL: never.
    Column("thinned_at", Float),
    # What people say of a run from the dashboard (null in rows from before them): a JSON
    # list of tags, free notes, and whether it is archived (hidden from the list by default).
    Column("tags", Text),
    Column("notes", Text),
    Column("archived", Boolean),
    # When it was archived (NULL: it is not); archived runs are deleted some days after it
    # when the project's retention says so (RunStore.archived_to_delete).
    Column("archived_at", Float),
    Index("ix_runs_started_at", "started_at"),
    # The runs list's filters and sort orders (GET /api/v1/runs).
    Index("ix_runs_project_started", "project", "started_at"),
    Index("ix_runs_status_started", "status", "started_at"),
    Index("ix_runs_name", "name"),
    Index("ix_runs_last_seen", "last_seen"),
    Index("ix_runs_job_key", "project", "job_key"),
    Index("ix_runs_job_id", "job_id"),
    Index("ix_runs_process_key", "project", "process_key"),
)

#: The names of each run's series (an index: the points are in ``chunks``), and a summary of
#: each kept as its frames are stored (the runs list's metric columns and sort orders): the
#: value at its highest step, and its least and greatest finite values. A non-finite last value
#: is NULL in ``last_value`` and named in ``last_nonfinite`` (``nan``, ``inf``, ``-inf``): SQLite
#: stores a NaN as NULL. NULL everywhere: no point yet.
series = Table(
    "series",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("name", String(256), primary_key=True),
    Column("last_step", BigInteger),
    Column("last_value", Float),
    Column("last_nonfinite", String(8)),
    Column("min_value", Float),
    Column("max_value", Float),
)

chunks = Table(
    "chunks",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("series", String(256), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("n", Integer, nullable=False),
    Column("steps", LargeBinary, nullable=False),
    Column("times", LargeBinary, nullable=False),
    Column("vals", LargeBinary, nullable=False),
    # How steps, times and vals are written (trainvitals.server.storage.codec): NULL or 0,
    # packed arrays as every row before the codec; 1, delta-of-delta and XOR, deflated; 2, as
    # 1 with float32 values and whole-microsecond times in narrower forms (what is written now).
    Column("encoding", SmallInteger),
    # NULL: steps and times are in this row; else the ``clocks`` row of the run that holds
    # them (this row's are empty), shared with the other series' blocks that have the same.
    Column("clock", BigInteger),
)

#: Encoded steps and times that compacted blocks of a run's series share (``chunks.clock``):
#: stored once however many series have exactly those. ``id``: a hash of them.
clocks = Table(
    "clocks",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("steps", LargeBinary, nullable=False),
    Column("times", LargeBinary, nullable=False),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("project", String(200), nullable=False),
    Column("run_name", String(200), nullable=False),
    Column("rule", String(64), nullable=False),
    Column("subject", String(128), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("hint", Text, nullable=False),
    Column("evidence", Text, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("time", Float, nullable=False),
    Column("updated_time", Float, nullable=False),
    Column("resolved_time", Float),
    Column("count", Integer, nullable=False),
    Column("acknowledged_at", Float),
    Column("acknowledged_by", String(200)),
    Column("silenced_until", Float),
    # Set when the alert stopped firing because its run ended (state "closed").
    Column("closed_time", Float),
    Column("closed_reason", String(64)),
    Index("ix_alerts_run", "run_id"),
    Index("ix_alerts_state_time", "state", "time"),
)

silences = Table(
    "silences",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("run_id", String(64), nullable=False),
    Column("rule", String(64), nullable=False),
    Column("subject", String(128), nullable=False),
    Column("until", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("created_by", String(200)),
)

#: Numbered agent frames other than points that are kept as they came (an autopsy).
events = Table(
    "events",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("time", Float, nullable=False),
    Column("data", Text, nullable=False),
)


#: Alert changes waiting for, or done with, a notification channel (the notify outbox).
#: Rows are written in the alert's own transaction; ``owner`` is the server process that
#: delivers a pending row, for as long as its ``lease_until`` is renewed.
outbox = Table(
    "outbox",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("channel", String(100), nullable=False),
    Column("alert_id", String(64), nullable=False),
    Column("change", String(16), nullable=False),
    Column("alert", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", Text),
    Column("done_at", Float),
    Column("owner", String(64), nullable=False),
    Column("lease_until", Float, nullable=False),
    Index("ix_outbox_state_lease", "state", "lease_until"),
    Index("ix_outbox_alert_channel", "alert_id", "channel"),
)

#: Access tokens (see :mod:`~trainvitals.server.storage.tokens`): only a hash of each is kept.
tokens = Table(
    "tokens",
    metadata,
    Column("id", String(16), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("project", String(200), nullable=False),
    Column("role", String(16), nullable=False),
    Column("hash", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float),
    # When a request or websocket last proved itself with it (or a session made from it), to
    # a minute (tokens.USE_RESOLUTION); NULL: never since this column came (revision 0009).
    Column("last_used_at", Float),
)

#: Browser sessions, each traded once for a token (an HttpOnly cookie's hash).
sessions = Table(
    "sessions",
    metadata,
    Column("hash", String(64), primary_key=True),
    Column("token_id", String(16), nullable=False),
    Column("expires_at", Float, nullable=False),
    Index("ix_sessions_token", "token_id"),
)

#: Which server process does a piece of work only one may do at a time (see
#: :mod:`~trainvitals.server.storage.leases`).
leases = Table(
    "leases",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("owner", String(64), nullable=False),
    Column("expires", Float, nullable=False),
)


def shown_database(db: str) -> str:
    """``db`` as it may be printed or logged: a URL's password masked."""
    if "://" not in db:
        return db
    try:
        return make_url(db).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy reads: say nothing of it
        return "<unreadable database URL>"


def database_url(db: str) -> str:
    """Accept a plain file path, ``sqlite:///path`` or ``postgresql://...``."""
    if "://" not in db:
        return "sqlite:///" + os.path.abspath(db)
    url = make_url(db)
    if url.drivername in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise StorageError(f"Expected a SQLite path or a postgresql:// URL, but got {db!r}")
    return db


def connect(url: str) -> Engine:
    """The engine of a URL from :func:`database_url`."""
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def dialect_insert(engine: Engine, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An ``INSERT`` with the dialect's ``ON CONFLICT`` clauses (both dialects have them)."""
    insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
    return insert(table)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the API read while the writer thread commits; NORMAL is durable across a
    # process crash (only an OS crash can lose the last commits).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    # As PostgreSQL answers: LIKE tells case apart (a tag filter: "gpu" is not "GPU"), and
    # lower() lowers every letter, not ASCII's only (a name filter: "Ärger" finds "ärger").
    cursor.execute("PRAGMA case_sensitive_like=ON")
    cursor.close()
    dbapi_connection.create_function("lower", 1, _lower, deterministic=True)


def _lower(text: Any) -> Any:
    return text.lower() if isinstance(text, str) else text
