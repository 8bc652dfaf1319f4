"""The open agent connections by run: what a watchdog's hello waits for."""

from __future__ import annotations

import asyncio

from trainvitals.server.connections import OpenRuns


def test_a_watchdog_waits_for_the_runs_open_connections_and_no_longer_than_told() -> None:
    async def scenario() -> tuple[bool, bool, bool, bool]:
        runs = OpenRuns()
        nothing_open = await runs.drained("r1", timeout=0)
        first, second = runs.opened("r1"), runs.opened("r1")
        other = runs.opened("r2")  # another run's connection holds nobody up
        waiting = asyncio.create_task(runs.drained("r1", timeout=60))
        runs.closed("r1", first)
        await asyncio.sleep(0)
        after_one = waiting.done()  # one of the two is still open
        runs.closed("r1", second)
        both_closed = await waiting
        runs.closed("r2", other)
        runs.opened("r3")  # a connection left open (a network cut): the wait ends anyway
        timed_out = await runs.drained("r3", timeout=0.01)
        return nothing_open, after_one, both_closed, timed_out

    assert asyncio.run(scenario()) == (True, False, True, False)
