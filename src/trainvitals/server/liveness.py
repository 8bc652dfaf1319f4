"""Runs that go silent: no frame, not even a heartbeat, for ``lost_after`` seconds.

A host that dies or a network that is cut leaves no ending; the run becomes ``lost`` with
``end_reason: heartbeat_lost``. The state is rebuilt from storage when the server starts, so
runs that were running before a restart are judged by their stored ``last_seen`` and come back
to ``running`` as soon as their agent reconnects.

Replicas sharing one database sweep one at a time, under a lease
(:mod:`~trainvitals.server.leases`): the one that holds it judges every run by the last-seen
time stored by whichever replica hears it, so a run streaming to another replica is not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.server.leases import SWEEP, Leases
from trainvitals.server.live import Hub
from trainvitals.server.storage import RunStore
from trainvitals.server.writer import Writer, log_failure

log = logging.getLogger("trainvitals.server")


class Liveness:
    """Last-seen times of running runs, and the task that gives up on silent ones."""

    def __init__(
        self,
        runs: RunStore,
        writer: Writer,
        hub: Hub,
        lost_after: float,
        on_lost: Callable[[str, float], Awaitable[None]] | None = None,
        leases: Leases | None = None,
    ) -> None:
        self._runs, self._writer, self._hub = runs, writer, hub
        self._leases = leases
        self._on_lost = on_lost
        self.lost_after = lost_after
        self._seen: dict[str, float] = {}
        #: Runs given up as lost that an open connection may yet bring back.
        self._lost: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def seen(self, run_id: str, when: float) -> None:
        self._seen[run_id] = when

    def ended(self, run_id: str) -> None:
        self._seen.pop(run_id, None)
        self._lost.discard(run_id)

    def revive(self, run_id: str) -> bool:
        """Whether ``run_id`` was given up as lost (once): its points came after all."""
        if run_id in self._lost:
            self._lost.discard(run_id)
            return True
        return False

    def resume(self, now: float) -> None:
        """The server itself was paused (the event loop stalled, the host was suspended):
        nothing could be heard meanwhile, so nobody is counted silent for it."""
        for run_id in self._seen:
            self._seen[run_id] = now

    async def start(self) -> None:
        stored = await asyncio.to_thread(self._runs.running_runs)
        for run_id, last_seen in stored.items():
            self._seen.setdefault(run_id, last_seen)
        self._task = asyncio.create_task(self._watch(), name="trainvitals-liveness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._leases is not None:  # the next replica sweeps at once
            with contextlib.suppress(WriterClosed, StorageUnavailable):
                await self._leases.release(SWEEP)

    async def sweeping(self) -> bool:
        """Whether this process sweeps now (it holds the lease, or there is none): if so,
        what every replica stored of the running runs is taken up first."""
        if self._leases is None:
            return True
        if not await self._leases.claim(SWEEP):
            return False
        stored = await asyncio.to_thread(self._runs.running_runs)
        for run_id in self._seen.keys() - stored.keys():  # ended, or lost, elsewhere
            self._seen.pop(run_id, None)
        for run_id, last_seen in stored.items():
            self._seen[run_id] = max(self._seen.get(run_id, last_seen), last_seen)
        return True

    async def check(self, now: float) -> list[str]:
        """Mark every run silent for longer than ``lost_after`` as lost; returns their ids.

        The runs are given up together, not one after another: when a node or a whole
        cluster dies, its runs' writes share the writer's transactions and their ``crash``
        alerts reach the notification channels together, so that a flood of lost runs pages
        each channel with the first alert and a digest of the rest rather than with a
        message for each window that one run after another took. A run whose write failed
        is judged again at the next sweep; the others go on."""
        silent = {r: seen for r, seen in self._seen.items() if now - seen > self.lost_after}
        for run_id in silent:
            self._seen.pop(run_id)
        outcomes = await asyncio.gather(
            *(self._give_up(run_id, seen, now) for run_id, seen in silent.items()),
            return_exceptions=True,
        )
        for run_id, outcome in zip(silent, outcomes, strict=True):
            if isinstance(outcome, WriterClosed):  # the server is stopping
                break
            if isinstance(outcome, BaseException):
                log_failure(outcome, "giving up run %s as lost failed", run_id)
        return list(silent)

    async def _give_up(self, run_id: str, seen: float, now: float) -> None:
        try:
            run = await self._writer.submit(partial(self._runs.mark_lost, run_id=run_id, now=now))
        except Exception:
            self._seen.setdefault(run_id, seen)  # nothing changed: judged at the next sweep
            raise
        if run is None:
            return
        self._lost.add(run_id)
        log.warning(
            "run %s (%s) lost: nothing heard for %.0f s", run_id, run["name"], self.lost_after
        )
        self._hub.run_changed(run, fresh=True)
        if self._on_lost is not None:
            await self._on_lost(run_id, run["ended_at"] or now)

    async def _watch(self) -> None:
        interval = min(1.0, self.lost_after / 4)
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            gap, last = now - last, now
            try:
                if gap > interval + self.lost_after / 4:
                    # The frames that came during the pause wait in the sockets: judge only
                    # once they have been read.
                    log.warning("the server was paused %.1f s; no run is judged lost for it", gap)
                    self.resume(time.time())
                    continue
                if await self.sweeping():
                    await self.check(time.time())
            except Exception as exc:  # a database hiccup must not end the watch
                log_failure(exc, "liveness check failed")
