"""One thread that applies every write, many per transaction (group commit).

SQLite takes one writer at a time, and a commit costs far more than a row. Ingest handlers
therefore hand their writes to this thread and await the result; whatever queued up while
the previous transaction committed goes into the next one. An agent is acknowledged only
after its frame is committed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from trainvitals.exceptions import WriterClosed

if TYPE_CHECKING:  # only a type here; imported, it closes a cycle (store, notify, writer)
    from trainvitals.server.store import Store

log = logging.getLogger("trainvitals.server")

T = TypeVar("T")
Operation = Callable[[Connection], Any]
_Item = tuple[Operation, "asyncio.Future[Any]", asyncio.AbstractEventLoop]

#: Most operations per transaction; bounds the latency one commit adds to the first in line.
MAX_BATCH = 512


class Writer:
    """Serialises writes onto a thread named ``trainvitals-writer``."""

    def __init__(self, store: Store, on_commit: Callable[[float], None] | None = None) -> None:
        self._store = store
        #: Told the seconds each committed transaction took (``GET /metrics``).
        self._on_commit = on_commit
        # The thread's own connection, kept between transactions: taking one from the pool
        # for each would add a ping and a rollback on return to every commit.
        self._conn: Connection | None = None
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trainvitals-writer", daemon=True)
        self._thread.start()

    async def submit(self, operation: Callable[[Connection], T]) -> T:
        """Run ``operation(connection)`` inside a transaction; return its result once committed."""
        if self._closed:
            raise WriterClosed("the server is shutting down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((operation, future, loop))
        return await future

    @property
    def queue_depth(self) -> int:
        """Writes waiting for the thread."""
        return self._queue.qsize()

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the thread."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._disconnect()

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._apply(batch)
                    return
                batch.append(more)
            self._apply(batch)

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._disconnect()
            self._conn = self._store.engine.connect()
            if self._store.dialect == "postgresql":
                # Durable as SQLite's synchronous=NORMAL is (storage/schema.py): a commit
                # survives the crash of any server process, and only a crash of PostgreSQL
                # or its host can lose the last fraction of a second of commits. Waiting for
                # the WAL flush at each commit cost three quarters of the ingest rate.
                self._conn.exec_driver_sql("SET synchronous_commit TO off")
                self._conn.commit()
        return self._conn

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.warning("closing the writer's database connection failed", exc_info=True)

    def _apply(self, batch: list[_Item], retry: bool = True) -> None:
        conn = None
        try:
            conn = self._connection()
            started = time.perf_counter()
            with conn.begin():
                results = [operation(conn) for operation, _, _ in batch]
            if self._on_commit is not None:
                self._on_commit(time.perf_counter() - started)
        except Exception as exc:
            lost = (isinstance(exc, DBAPIError) and exc.connection_invalidated) or _lost(conn)
            if conn is not None:
                self._store.rolled_back(conn)
            self._disconnect()  # the next transaction starts on a fresh connection
            if retry and lost:
                # The database dropped the kept connection (it restarted, or an idle
                # timeout): the same writes again, on a connection the pool checks first.
                self._apply(batch, retry=False)
                return
            if len(batch) > 1:
                # One bad write must not fail its neighbours: apply them one by one.
                for item in batch:
                    self._apply([item])
                return
            log.exception("write failed")
            _settle(batch[0][2], [(batch[0][1], None, exc)])
            return
        # One wake-up of each waiting event loop for the whole batch, not one per write.
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for (_, future, loop), result in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append((future, result, None))
        for loop, outcomes in by_loop.items():
            _settle(loop, outcomes)


def _lost(conn: Connection | None) -> bool:
    """Whether the database dropped the driver's connection under ``conn``: the writes made as
    a transaction commits go to the driver's connection, and SQLAlchemy neither wraps their
    errors nor marks the connection invalidated (psycopg says it is ``broken``)."""
    if conn is None:
        return False
    if conn.invalidated:
        return True
    try:
        raw = conn.connection.driver_connection
    except Exception:  # closed, not lost: nothing to try again on
        return False
    return bool(getattr(raw, "broken", False))


#: A write's future, and its result or its error.
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _settle(loop: asyncio.AbstractEventLoop, outcomes: list[_Outcome]) -> None:
    def settle() -> None:
        for future, result, error in outcomes:
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop is closed: nobody is waiting any more
        pass
