"""The liveness sweep: silent runs are lost; a paused server judges nobody for its pause."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from tests.server.storage.rows import hello
from trainvitals.server.live import Hub
from trainvitals.server.liveness import Liveness
from trainvitals.server.storage import RunSummary, UnitOfWork
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


def test_runs_lost_together_are_given_up_together_and_a_failed_write_is_tried_again(
    tmp_path: Path,
) -> None:
    """A dead node's runs go silent together: their ``crash`` alerts must be underway
    together (so that a channel hears them within one window, as one digest), not one run's
    round trips after another's. Each ``on_lost`` here waits until every run expected has
    been called: a sweep that gave them up one at a time would never finish."""
    store = Store(str(tmp_path / "tv.db"))
    store.create_schema()
    runs = [f"r{index}" for index in range(8)]
    mark_lost = store.runs.mark_lost
    disk_full = {"r7"}

    def marking(work: UnitOfWork, run_id: str, now: float) -> RunSummary | None:
        if run_id in disk_full:
            raise OSError("the disk is full")
        return mark_lost(work, run_id=run_id, now=now)

    store.runs.mark_lost = marking  # type: ignore[method-assign]

    async def scenario() -> list[tuple[list[str], list[str]]]:
        writer = Writer(store)
        called: list[str] = []
        expected = 7  # r7's write fails: no alert for it
        everyone = asyncio.Event()

        async def on_lost(run_id: str, when: float) -> None:
            called.append(run_id)
            if len(called) == expected:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), timeout=10)

        try:
            for run_id in runs:
                await writer.submit(partial(store.runs.open_run, hello=hello(run_id), now=100.0))
            liveness = Liveness(store.runs, writer, Hub(), lost_after=30.0, on_lost=on_lost)
            for run_id in runs:
                liveness.seen(run_id, 100.0)
            sweeps = [(sorted(await liveness.check(now=131.0)), sorted(called))]
            disk_full.clear()
            called.clear()
            everyone.clear()
            expected = 1
            sweeps.append((await liveness.check(now=132.0), called))
            return sweeps
        finally:
            writer.close()

    first, second = asyncio.run(scenario())
    assert first == (runs, runs[:7])
    assert second == (["r7"], ["r7"])  # judged again at the next sweep, and given up
    assert [(r := store.runs.get_run(run_id)) and r["status"] for run_id in runs] == ["lost"] * 8
    store.dispose()
