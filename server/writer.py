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
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from trainvitals.server.storage import Store

log = logging.getLogger("trainvitals.server")

T = TypeVar("T")
Operation = Callable[[Connection], Any]
_Item = tuple[Operation, "asyncio.Future[Any]", asyncio.AbstractEventLoop]

#: Most operations per transaction; bounds the latency one commit adds to the first in line.
MAX_BATCH = 512


class WriterClosed(RuntimeError):
    """A write was submitted after :meth:`Writer.close`."""


class Writer:
    """Serialises writes onto a thread named ``trainvitals-writer``."""

    def __init__(self, store: Store) -> None:
        self._store = store
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

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the thread."""
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
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

    def _apply(self, batch: list[_Item]) -> None:
        try:
            with self._store.engine.begin() as conn:
                results = [operation(conn) for operation, _, _ in batch]
        except Exception as exc:
            if len(batch) > 1:
                # One bad write must not fail its neighbours: apply them one by one.
                for item in batch:
                    self._apply([item])
                return
            log.exception("write failed")
            _settle(batch[0][1], batch[0][2], error=exc)
            return
        for (_, future, loop), result in zip(batch, results, strict=True):
            _settle(future, loop, result=result)


def _settle(
    future: asyncio.Future[Any],
    loop: asyncio.AbstractEventLoop,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    def settle() -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop is closed: nobody is waiting any more
        pass
