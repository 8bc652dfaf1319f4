"""The writer thread: one kept connection, group commit, and what a failure leaves behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from harness.polling import wait_for
from harness.processes import POSTGRES_ADMIN_URL
from harness.services import private_postgres
from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.protocol import Columns
from trainvitals.server.storage import UnitOfWork
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer, WriterState

HELLO = {
    "run_id": "r1", "project": "p", "name": "n", "config": {}, "host": "h", "pid": 1,
    "started_at": 1.0, "env": {}, "job": None,
}  # fmt: skip


@pytest.fixture
def writer(store: Store) -> Iterator[Writer]:
    writer = Writer(store)
    yield writer
    writer.close()


def backend_pid(work: UnitOfWork) -> int:
    return int(work.connection().execute(text("SELECT pg_backend_pid()")).scalar_one())


def synchronous_commit(work: UnitOfWork) -> str:
    return str(work.connection().execute(text("SHOW synchronous_commit")).scalar_one())


def test_writes_share_one_connection_and_survive_its_loss(postgres_url: str) -> None:
    store = Store(postgres_url)
    store.create_schema()
    writer = Writer(store)
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:

        async def scenario() -> None:
            await writer.submit(partial(store.runs.open_run, hello=HELLO, now=1.0))
            first, second = [await writer.submit(backend_pid) for _ in range(2)]
            assert first == second  # no checkout (a ping and a rollback) per transaction
            # Durable across a server process's crash, not a WAL flush per commit.
            assert await writer.submit(synchronous_commit) == "off"
            with admin.connect() as conn:  # the database drops it (a restart, a proxy timeout)
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
            points = {"loss": Columns([1], [1.0], [0.5])}
            assert (
                await writer.submit(
                    partial(store.series.add_points, run_id="r1", seq=1, points=points, now=2.0)
                )
                == 1
            )
            assert await writer.submit(backend_pid) != first
            assert await writer.submit(synchronous_commit) == "off"  # on the new one too

        asyncio.run(scenario())
        run = store.runs.get_run("r1")
        assert run is not None and run["series"] == ["loss"] and run["last_step"] == 1
    finally:
        writer.close()
        admin.dispose()
        store.dispose()


def test_a_rolled_back_frame_stores_its_series_when_it_is_replayed(
    store: Store, writer: Writer
) -> None:
    points = {
        "loss": Columns([1, 2], [1.0, 2.0], [0.5, 0.4]),
        "grad/global_norm": Columns([1], [1.0], [3.0]),
    }

    def fails_after_storing(work: UnitOfWork) -> Any:
        store.series.add_points(work, "r1", 1, points, now=2.0)
        raise RuntimeError("the disk is full")

    async def scenario() -> None:
        await writer.submit(partial(store.runs.open_run, hello=HELLO, now=1.0))
        with pytest.raises(RuntimeError, match="disk is full"):
            await writer.submit(fails_after_storing)
        # The agent was not acknowledged, so it sends the frame again.
        await writer.submit(
            partial(store.series.add_points, run_id="r1", seq=1, points=points, now=3.0)
        )

    asyncio.run(scenario())
    run = store.runs.get_run("r1")
    assert run is not None and run["series"] == ["grad/global_norm", "loss"]
    assert store.series.read_series("r1", "loss")[0].tolist() == [1, 2]


def test_a_database_outage_is_retried_then_refused_and_never_kills_the_writer() -> None:
    """PostgreSQL stopped: a write waits while the writer tries again, for its patience; then
    it fails unstored, and writes are refused at once until the database is back. The writer
    then stores again, and closes at once whatever the database's state."""
    states: list[WriterState] = []
    errors: list[tuple[str, bool]] = []
    with private_postgres() as pg:
        store = Store(pg.url)
        store.create_schema()
        writer = Writer(
            store,
            on_state=states.append,
            on_error=lambda exc, retried: errors.append((type(exc).__name__, retried)),
            patience=0.5,
        )
        try:

            async def scenario() -> None:
                await writer.submit(partial(store.runs.open_run, hello=HELLO, now=1.0))
                pg.stop()
                with pytest.raises(StorageUnavailable, match="cannot store now"):
                    await writer.submit(partial(store.runs.touch, run_id="r1", now=2.0))
                assert writer.state is WriterState.UNAVAILABLE
                with pytest.raises(StorageUnavailable):  # at once: nothing queued meanwhile
                    await asyncio.wait_for(writer.submit(backend_pid), 0.1)
                pg.start()
                await asyncio.to_thread(
                    wait_for, lambda: writer.state is WriterState.OK, 20, what="recovery"
                )
                await writer.submit(partial(store.runs.touch, run_id="r1", now=3.0))

            asyncio.run(scenario())
            run = store.runs.get_run("r1")
            assert run is not None and run["last_seen"] == 3.0
            assert states[:3] == [WriterState.RETRYING, WriterState.UNAVAILABLE, WriterState.OK]
            assert errors and all(name == "OperationalError" for name, _ in errors)
            assert any(retried for _, retried in errors)
            pg.stop()  # down as the server stops: the writer ends within its bound
            started = time.monotonic()

            async def last_write() -> None:
                pending = asyncio.ensure_future(
                    writer.submit(partial(store.runs.touch, run_id="r1", now=4.0))
                )
                await asyncio.sleep(0)
                await asyncio.to_thread(writer.close, 5.0)
                with pytest.raises(WriterClosed):
                    await pending

            asyncio.run(last_write())
            assert time.monotonic() - started < 3.0 and writer.state is WriterState.CLOSED
        finally:
            writer.close()
            store.dispose()
