"""The compactor: a background task that rewrites runs' stored frames as compact blocks.

The writer stores each agent frame as it comes, in the cheap packed layout (24 bytes a point,
plus a row per series and frame), so that ingest keeps its pace. Every ``compact_interval``
seconds this task looks for runs with frames to merge (:meth:`SeriesStore.runs_to_compact
<trainvitals.server.storage.series.SeriesStore.runs_to_compact>`) and merges them, in a
thread, a block per short transaction: ended runs whole, live runs once enough frames lie
beyond the history the alert engine replays after a restart. Replicas may all run it: a block
is merged by one of them (see :meth:`SeriesStore.compact
<trainvitals.server.storage.series.SeriesStore.compact>`).

It also applies the retention policy (``thin_after_days``): runs that ended longer ago than
their project's days are thinned to a min/max summary (:meth:`SeriesStore.thin
<trainvitals.server.storage.series.SeriesStore.thin>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from trainvitals.server.alerts import REPLAY_FRAMES
from trainvitals.server.settings import Retention
from trainvitals.server.storage import SeriesStore

log = logging.getLogger("trainvitals.server")

#: A live run is compacted once this many frames lie beyond the replayed history.
LIVE_AFTER_FRAMES = 2000


class Compactor:
    """Runs :meth:`sweep` every ``interval`` seconds (0: never).

    Args:
        series: the store's series.
        interval: seconds between sweeps.
        retention: days after its end before a run is thinned, per project.
        thin_points: the points a thinned series keeps.
        clock: Unix time (injected by tests).
    """

    def __init__(
        self,
        series: SeriesStore,
        interval: float,
        retention: Retention | None = None,
        thin_points: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._series = series
        self.interval = interval
        self._retention = retention or Retention()
        self._thin_points = thin_points
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.create_task(self._loop(), name="trainvitals-compactor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def sweep(self) -> int:
        """Thin the runs past their retention, then compact every run that is due; returns
        the frames merged."""
        now = self._clock()
        for run_id in self._series.runs_to_thin(now, self._retention):
            removed = self._series.thin(run_id, self._thin_points, now)
            log.info("thinned run %s: %d points left out", run_id, removed)
        merged = 0
        for due in self._series.runs_to_compact(REPLAY_FRAMES, LIVE_AFTER_FRAMES):
            merged += self._series.compact(due)
        return merged

    async def _loop(self) -> None:
        while True:
            try:
                merged = await asyncio.to_thread(self.sweep)
                if merged:
                    log.info("compacted %d stored frames", merged)
            except Exception:  # a database hiccup: the next sweep tries again
                log.exception("compaction failed; retrying in %.0f s", self.interval)
            await asyncio.sleep(self.interval)
