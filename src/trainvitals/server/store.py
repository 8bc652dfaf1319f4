"""The server's database: one engine, and a part of it for each concern.

- ``store.runs``: runs, their jobs and events (:mod:`~trainvitals.server.storage.runs`);
- ``store.series``: the points of their series (:mod:`~trainvitals.server.storage.series`);
- ``store.alerts``: alerts and silences (:mod:`~trainvitals.server.storage.alerts`);
- ``store.outbox``: the notifications queued for delivery (:mod:`~trainvitals.server.notify.store`);
- ``store.tokens``: access tokens and browser sessions (:mod:`~trainvitals.server.storage.tokens`);
- ``store.leases``: which replica does what (:mod:`~trainvitals.server.storage.leases`).

Every method is synchronous. Those that take a ``work`` write, in the unit of work
(:mod:`~trainvitals.server.storage.unit_of_work`) of the transaction the
:class:`~trainvitals.server.writer.Writer` thread gives them, or :meth:`Store.transaction`;
the others read, on a connection of their own (in FastAPI's thread pool).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import delete, select

from trainvitals.server.migrations import upgrade
from trainvitals.server.notify.store import OutboxStore
from trainvitals.server.settings import Retention
from trainvitals.server.storage.alerts import AlertStore
from trainvitals.server.storage.leases import RUN, LeaseStore
from trainvitals.server.storage.run_queries import archived_past
from trainvitals.server.storage.runs import RunStore, lock_run
from trainvitals.server.storage.schema import (
    alerts,
    chunks,
    clocks,
    connect,
    database_url,
    events,
    leases,
    outbox,
    runs,
    series,
    silences,
)
from trainvitals.server.storage.series import SeriesStore
from trainvitals.server.storage.tokens import TokenStore
from trainvitals.server.storage.unit_of_work import UnitOfWork, transaction


class Store:
    """Runs, series, alerts and notifications in one database, on SQLite or PostgreSQL.

    Example:
        ```python
        store = Store("runs.db")  # or Store("postgresql://user@host/db")
        store.create_schema()
        store.runs.list_runs(project="mnist")
        ```
    """

    def __init__(self, db: str) -> None:
        self.url = database_url(db)
        self.engine = connect(self.url)
        self.dialect = self.engine.dialect.name
        self.series = SeriesStore(self.engine)
        self.runs = RunStore(self.engine)
        self.alerts = AlertStore(self.engine)
        self.outbox = OutboxStore(self.engine)
        self.tokens = TokenStore(self.engine)
        self.leases = LeaseStore(self.engine)

    def create_schema(self) -> str:
        """Make the tables, or bring those of an older database up to date (the Alembic
        migrations, as ``trainvitals db upgrade``); returns the revision it is at."""
        return upgrade(self.engine)

    def delete_run(self, work: UnitOfWork, run_id: str) -> bool:
        """Delete a run and everything of it: its points, events, alerts, silences, notices
        and its detector's lease. Returns whether there was such a run."""
        conn = work.connection()
        lock_run(conn, run_id)  # no compactor's block or clock written after, to outlive it
        alert_ids = select(alerts.c.id).where(alerts.c.run_id == run_id)
        conn.execute(delete(outbox).where(outbox.c.alert_id.in_(alert_ids)))
        for table in (alerts, silences, chunks, clocks, series, events):
            conn.execute(delete(table).where(table.c.run_id == run_id))
        conn.execute(delete(leases).where(leases.c.name == RUN + run_id))
        work.forget_run(run_id)  # its frames in this transaction are not stored
        return bool(conn.execute(delete(runs).where(runs.c.id == run_id)).rowcount)

    def delete_archived(
        self, work: UnitOfWork, run_id: str, now: float, after_days: Retention
    ) -> str | None:
        """Delete the run as :meth:`delete_run` does if it is still archived longer ago than
        its project's days (nobody brought it back meanwhile); returns its project, or None
        when it was kept."""
        conn = work.connection()
        due = archived_past(now, after_days)
        if due is None:
            return None
        # Under the row's lock on PostgreSQL: a replica's unarchiving waits, or wins.
        project = conn.execute(
            select(runs.c.project).where(runs.c.id == run_id, due).with_for_update()
        ).scalar()
        if project is None or not self.delete_run(work, run_id):
            return None
        return str(project)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[UnitOfWork]:
        """A unit of work in a transaction of its own, flushed and committed when the block
        ends (rolled back, and what it held dropped, when it raises): writes made outside the
        :class:`~trainvitals.server.writer.Writer`, by scripts and tests.

        Example:
            ```python
            with store.transaction() as work:
                store.runs.touch(work, "r1", now=time.time())
            ```
        """
        with self.engine.connect() as conn, transaction(conn) as work:
            yield work

    def dispose(self) -> None:
        self.tokens.uses.close()
        self.engine.dispose()
