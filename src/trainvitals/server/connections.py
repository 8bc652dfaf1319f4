"""The agent connections open on this server process, by run."""

from __future__ import annotations

import asyncio

__all__ = ["OpenRuns"]


class OpenRuns:
    """The agent connections open on this process, by run: a watchdog, speaking for a run
    whose process died, numbers its ``end`` after every frame that process sent, and those
    may still be queued here, behind a loaded writer, when the watchdog says hello."""

    def __init__(self) -> None:
        self._open: dict[str, set[asyncio.Event]] = {}

    def opened(self, run_id: str) -> asyncio.Event:
        """A connection of ``run_id`` said hello; set the event it returns when it closes."""
        closed = asyncio.Event()
        self._open.setdefault(run_id, set()).add(closed)
        return closed

    def closed(self, run_id: str, event: asyncio.Event) -> None:
        """The connection whose event :meth:`opened` returned closed."""
        event.set()
        connections = self._open.get(run_id, set())
        connections.discard(event)
        if not connections:
            self._open.pop(run_id, None)

    async def drained(self, run_id: str, timeout: float) -> bool:
        """Wait until the connections of ``run_id`` open now have closed; False on timeout."""
        waiting = [event.wait() for event in self._open.get(run_id, ())]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*waiting)
        except TimeoutError:
            return False
        return True
