"""The writer thread: one kept connection, group commit, and what a failure leaves behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, text

from harness.processes import POSTGRES_ADMIN_URL
from trainvitals.protocol import Columns
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer

HELLO = {
    "run_id": "r1", "project": "p", "name": "n", "config": {}, "host": "h", "pid": 1,
    "started_at": 1.0, "env": {}, "job": None,
}  # fmt: skip


@pytest.fixture
def writer(store: Store) -> Iterator[Writer]:
    writer = Writer(store)
    yield writer
    writer.close()


def backend_pid(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def synchronous_commit(conn: Connection) -> str:
    return str(conn.execute(text("SHOW synchronous_commit")).scalar_one())


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

    def fails_after_storing(conn: Connection) -> Any:
        store.series.add_points(conn, "r1", 1, points, now=2.0)
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
