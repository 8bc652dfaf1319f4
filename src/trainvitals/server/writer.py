"""One thread that applies every write, many per transaction (group commit).

SQLite takes one writer at a time, and a commit costs far more than a row. Ingest handlers
therefore hand their writes to this thread and await the result; whatever queued up while
the previous transaction committed goes into the next one. The writes of a transaction share
its unit of work (:mod:`~trainvitals.server.storage.unit_of_work`), which holds their frames'
points and writes them all at once before the commit. An agent is acknowledged only after its
frame is committed.

The database may go away (PostgreSQL restarted, a disk full, SQLite locked by another
process). The thread never dies of it: a transaction that fails so is tried again, with
jittered exponential backoff, for :data:`PATIENCE` seconds (:attr:`WriterState.RETRYING`);
past that, its writes fail with :class:`~trainvitals.exceptions.StorageUnavailable`, nothing
of them stored, and so do the writes submitted until the database answers again
(:attr:`WriterState.UNAVAILABLE`): agents are told to come back later rather than kept
waiting, and the server's memory does not fill with frames it cannot store.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy import exc as sa

from trainvitals.backoff import backoff_delays
from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.server.storage.unit_of_work import UnitOfWork, transaction

if TYPE_CHECKING:  # only a type here; imported, it closes a cycle (store, notify, writer)
    from trainvitals.server.store import Store

log = logging.getLogger("trainvitals.server")

T = TypeVar("T")
Operation = Callable[[UnitOfWork], Any]
_Item = tuple[Operation, "asyncio.Future[Any]", asyncio.AbstractEventLoop]

#: Most operations per transaction; bounds the latency one commit adds to the first in line.
MAX_BATCH = 512
#: Seconds a failing transaction is tried again before its writes are refused: a database
#: restart of a second or two goes unnoticed by agents; a longer outage tells them to retry.
PATIENCE = 5.0
#: The backoff between tries (seconds): the first ceiling, and the most.
RETRY_FIRST, RETRY_MOST = 0.1, 2.0


class WriterState(enum.IntEnum):
    """What the writer can do now (``GET /healthz``; the ``trainvitals_writer_state`` gauge)."""

    OK = 0
    #: A transaction failed on the database: tried again with backoff, its writes waiting.
    RETRYING = 1
    #: The database failed for longer than :data:`PATIENCE`: writes are refused
    #: (:class:`~trainvitals.exceptions.StorageUnavailable`) until it answers again.
    UNAVAILABLE = 2
    #: The server is stopping.
    CLOSED = 3


class Writer:
    """Serialises writes onto a thread named ``trainvitals-writer``."""

    def __init__(
        self,
        store: Store,
        on_commit: Callable[[float], None] | None = None,
        on_error: Callable[[BaseException, bool], None] | None = None,
        on_state: Callable[[WriterState], None] | None = None,
        patience: float = PATIENCE,
        delays: Callable[[], Iterator[float]] = lambda: backoff_delays(RETRY_FIRST, 2, RETRY_MOST),
    ) -> None:
        self._store = store
        #: Told the seconds each committed transaction took (``GET /metrics``).
        self._on_commit = on_commit
        #: Told each storage error, and whether the writes are tried again (``GET /metrics``).
        self._on_error = on_error
        #: Told each change of :attr:`state`, on the writer's thread.
        self._on_state = on_state
        self._patience = patience
        self._delays = delays
        # The thread's own connection, kept between transactions: taking one from the pool
        # for each would add a ping and a rollback on return to every commit.
        self._conn: Connection | None = None
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        #: Set by :meth:`close`: cuts a backoff short.
        self._stopping = threading.Event()
        self.state = WriterState.OK
        #: Why the database failed last (one line), for ``/healthz``.
        self.last_error: str | None = None
        #: Whether the last transaction committed (not only a probe answered): a failure
        #: right after a probe is the same outage, refused at once.
        self._proven = True
        self._thread = threading.Thread(target=self._run, name="trainvitals-writer", daemon=True)
        self._thread.start()

    async def submit(self, operation: Callable[[UnitOfWork], T]) -> T:
        """Run ``operation(work)`` with the unit of work of a transaction, which is flushed
        and committed after it (:mod:`~trainvitals.server.storage.unit_of_work`); return its
        result once committed.

        Raises :class:`~trainvitals.exceptions.StorageUnavailable` when the database cannot
        store (nothing of the write was stored), :class:`~trainvitals.exceptions.WriterClosed`
        once the server is stopping."""
        if self._closed:
            raise WriterClosed("the server is shutting down")
        if self.state is WriterState.UNAVAILABLE:
            raise StorageUnavailable(f"the database cannot store now: {self.last_error}")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((operation, future, loop))
        return await future

    @property
    def queue_depth(self) -> int:
        """Writes waiting for the thread."""
        return self._queue.qsize()

    def stopping(self) -> None:
        """The server is stopping: from now on a write that fails on the database is not
        tried again, so that what stops before the writer does not wait for it."""
        self._stopping.set()

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued (one try each while the database fails), then stop."""
        self._closed = True
        self._stopping.set()
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._disconnect()
            self._set_state(WriterState.CLOSED)

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
            except Exception:  # a connection the database dropped: nothing left to close
                log.debug("closing the writer's database connection failed", exc_info=True)

    def _apply(self, batch: list[_Item]) -> None:
        """Commit ``batch`` in one transaction, trying again while the database fails."""
        delays: Iterator[float] | None = None
        since = time.monotonic()
        while True:
            conn = None
            try:
                conn = self._connection()
                started = time.perf_counter()
                # A unit of work a try: what a failed one held is dropped with it.
                with transaction(conn) as work:
                    results = [operation(work) for operation, _, _ in batch]
                if self._on_commit is not None:
                    self._on_commit(time.perf_counter() - started)
            except Exception as exc:
                outage = is_outage(exc, conn)  # before the connection goes
                self._forget(conn, outage)
                if not outage:
                    self._refused(batch, exc)
                    return
                retry = not (
                    self._stopping.is_set()
                    or not self._proven
                    or time.monotonic() - since >= self._patience
                )
                self._failed(exc, retry)
                if not retry:
                    self._give_up(batch, delays)
                    return
                self._set_state(WriterState.RETRYING)
                delays = delays or self._delays()
                self._stopping.wait(next(delays))
                continue
            break
        self._proven = True
        self._set_state(WriterState.OK)
        # One wake-up of each waiting event loop for the whole batch, not one per write.
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for (_, future, loop), result in zip(batch, results, strict=True):
            by_loop.setdefault(loop, []).append((future, result, None))
        for loop, outcomes in by_loop.items():
            _settle(loop, outcomes)

    def _forget(self, conn: Connection | None, outage: bool = False) -> None:
        """The transaction failed: its connection goes (in an outage without the rollback a
        pool's reset would try, and log, on a lost one)."""
        if conn is not None and outage and not conn.invalidated:
            try:
                conn.invalidate()
            except Exception:  # lost already: nothing left to invalidate
                log.debug("invalidating a failed transaction's connection failed", exc_info=True)
        self._disconnect()  # the next transaction starts on a fresh connection

    def _refused(self, batch: list[_Item], exc: Exception) -> None:
        """A write failed on its own (a bug, a constraint): only it fails."""
        if len(batch) > 1:  # one bad write must not fail its neighbours: one by one
            for item in batch:
                self._apply([item])
            return
        log.error("write failed", exc_info=exc)
        _settle(batch[0][2], [(batch[0][1], None, exc)])

    def _give_up(self, batch: list[_Item], delays: Iterator[float] | None) -> None:
        """Fail ``batch`` (nothing of it is stored), then refuse writes until the database
        answers again: agents come back later instead of waiting with their frames here."""
        error = (
            WriterClosed("the server is shutting down and the database cannot store")
            if self._closed
            else StorageUnavailable(f"the database cannot store now: {self.last_error}")
        )
        if not self._closed:  # refused before its writers hear of it: they may try again
            self._set_state(WriterState.UNAVAILABLE)
            self._proven = False
        for _, future, loop in batch:
            _settle(loop, [(future, None, error)])
        if self._closed:
            return
        delays = delays or self._delays()
        while not self._stopping.wait(next(delays)):
            self._refuse_queued()
            try:
                conn = self._connection()
                conn.exec_driver_sql("SELECT 1")
                conn.rollback()
            except Exception as exc:
                self._forget(self._conn, outage=True)
                self._failed(exc, retried=True)
                continue
            log.warning("the database answers again: storing resumes")
            self._set_state(WriterState.OK)
            return

    def _refuse_queued(self) -> None:
        """Fail the writes that were queued as the database failed (nothing waits for them
        while it is down); :meth:`close`'s end mark stays for :meth:`_serve`."""
        error = StorageUnavailable(f"the database cannot store now: {self.last_error}")
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self._queue.put(None)
                return
            _settle(item[2], [(item[1], None, error)])

    def _failed(self, exc: BaseException, retried: bool) -> None:
        line = _one_line(exc)
        if self.state is WriterState.OK or line != self.last_error:  # once per outage and cause
            log.warning("the database cannot store (%s): trying again with backoff", line)
        self.last_error = line
        if self._on_error is not None:
            self._on_error(exc, retried)

    def _set_state(self, state: WriterState) -> None:
        if state is self.state:
            return
        self.state = state
        if self._on_state is not None:
            try:
                self._on_state(state)
            except Exception:
                log.exception("a writer state listener failed")


#: What says the database cannot store now (not that this write is wrong): it went away, its
#: disk is full, another process holds its lock, the pool had no connection to give.
_OUTAGES = (
    StorageUnavailable,
    sa.OperationalError,
    sa.InterfaceError,
    sa.DisconnectionError,
    sa.TimeoutError,
    sa.PendingRollbackError,
    sa.ResourceClosedError,
)


def is_outage(exc: BaseException, conn: Connection | None = None) -> bool:
    """Whether ``exc`` says the database cannot store now, rather than that a write is wrong."""
    if isinstance(exc, _OUTAGES):
        return True
    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return True
    return _lost(conn)


def log_failure(exc: BaseException, message: str, *args: object) -> None:
    """Log a background task's failure: with its traceback for a bug; in one line at debug
    level for a database outage, which the writer reports once (not each sweep)."""
    if is_outage(exc):
        log.debug(message + " (%s)", *args, _one_line(exc))
    else:
        log.error(message, *args, exc_info=exc)


def _one_line(exc: BaseException) -> str:
    """The driver's first line: no SQL, no bound values (a frame's data), no traceback."""
    cause = exc.orig if isinstance(exc, sa.DBAPIError) and exc.orig is not None else exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0][:200] if text else ''}"


def _lost(conn: Connection | None) -> bool:
    """Whether the database dropped the driver's connection under ``conn``: a unit of work's
    flush writes on the driver's connection, and SQLAlchemy neither wraps its errors nor marks
    the connection invalidated (psycopg says it is ``broken``)."""
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
