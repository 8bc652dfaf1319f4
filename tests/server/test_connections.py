"""The open connections: agents' by run (what a watchdog's hello waits for), and every
websocket by its token (what a revoke closes)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from starlette.websockets import WebSocket, WebSocketDisconnect

from harness.polling import wait_for_async
from trainvitals.server.connections import REMEMBER, REVOKED, OpenRuns, OpenTokens


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


class FakeSocket:
    """What a revoke calls of a websocket: ``close``; one whose peer left raises."""

    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.closes: list[tuple[int, str]] = []

    async def close(self, code: int, reason: str) -> None:
        if self.gone:
            raise WebSocketDisconnect(1006)
        self.closes.append((code, reason))


def test_a_revoke_closes_its_tokens_websockets_and_one_that_registers_just_after() -> None:
    async def scenario() -> None:
        now = [0.0]
        tokens = OpenTokens(clock=lambda: now[0])
        mine, theirs, left = FakeSocket(), FakeSocket(), FakeSocket(gone=True)
        held = {n: tokens.opened(t, cast(WebSocket, s)) for n, t, s in (
            ("mine", "a", mine), ("theirs", "b", theirs), ("left", "a", left))}  # fmt: skip
        assert tokens.revoked("a") == 2
        assert held["mine"].revoked and held["left"].revoked and not held["theirs"].revoked
        # The closes are tasks of their own.
        await wait_for_async(lambda: mine.closes, timeout=10, what="the revoked socket's close")
        assert mine.closes == [(1008, REVOKED)] and theirs.closes == []
        # A websocket whose token was read just before the revoke registers after it.
        late = FakeSocket()
        assert tokens.opened("a", cast(WebSocket, late)).revoked
        await wait_for_async(lambda: late.closes, timeout=10, what="the late socket's close")
        assert late.closes == [(1008, REVOKED)]
        # Long after, an id is forgotten (ids are not reused: a revoked token stays revoked).
        now[0] = REMEMBER + 1
        tokens.revoked("c")
        again = FakeSocket()
        assert not tokens.opened("a", cast(WebSocket, again)).revoked
        assert tokens.count("a") == 2  # late (never closed here: its handler does) and again

    loop_errors: list[Any] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda _, context: loop_errors.append(context))
        try:
            loop.run_until_complete(scenario())
        finally:
            loop.close()

    run()
    assert loop_errors == []  # the socket whose peer left raised nothing into the loop
