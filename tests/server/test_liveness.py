"""The liveness sweep: silent runs are lost; a paused server judges nobody for its pause."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from tests.server.storage.rows import hello
from trainvitals.server.live import Hub
from trainvitals.server.liveness import Liveness
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer


def test_a_pause_of_the_server_is_nobodys_silence_and_a_lost_run_may_come_back(
    tmp_path: Path,
) -> None:
    store = Store(str(tmp_path / "tv.db"))
    store.create_schema()

    async def scenario() -> tuple[list[str], list[str], bool, bool]:
        writer = Writer(store)
        try:
            for run_id in ("r1", "r2"):
                await writer.submit(partial(store.runs.open_run, hello=hello(run_id), now=100.0))
            liveness = Liveness(store.runs, writer, Hub(), lost_after=30.0)
            liveness.seen("r1", 100.0)
            liveness.seen("r2", 100.0)
            liveness.resume(now=500.0)  # the loop stood still from 100 to 500
            after_pause = await liveness.check(now=510.0)
            later = await liveness.check(now=531.0)
            return after_pause, later, liveness.revive("r1"), liveness.revive("r1")
        finally:
            writer.close()

    after_pause, later, first, second = asyncio.run(scenario())
    assert after_pause == [] and sorted(later) == ["r1", "r2"]
    assert (first, second) == (True, False)  # its points bring it back once
    store.dispose()
