"""The compactor: a background task that rewrites runs' stored frames as compact blocks.

The writer stores each agent frame as it comes, in the cheap packed layout (24 bytes a point,
plus a row per series and frame), so that ingest keeps its pace. Every ``compact_interval``
seconds this task looks for runs with frames to merge (:meth:`SeriesStore.runs_to_compact
<trainvitals.server.storage.series.SeriesStore.runs_to_compact>`) and merges them, in a
thread, a block per short transaction: ended runs whole, live runs once enough frames lie
beyond the history the alert engine replays after a restart. Replicas may all run it: a block
is merged by one of them (see :meth:`SeriesStore.compact
<trainvitals.server.storage.series.SeriesStore.compact>`).

It also applies the retention policies: runs that ended longer ago than their project's
``thin_after_days`` are thinned to a min/max summary (:meth:`SeriesStore.thin
<trainvitals.server.storage.series.SeriesStore.thin>`), and runs archived longer ago than its
``delete_archived_after_days`` are deleted with everything of them, through the writer as
``DELETE /api/v1/runs/{id}`` does, and browsers told (on every replica, through the broker).
Replicas delete one at a time, under a lease (:data:`~trainvitals.server.leases.RETENTION`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial

from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.server.alerts import REPLAY_FRAMES
from trainvitals.server.leases import RETENTION, Leases
from trainvitals.server.live import Hub
from trainvitals.server.settings import Retention
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer, log_failure

log = logging.getLogger("trainvitals.server")

#: A live run is compacted once this many frames lie beyond the replayed history.
LIVE_AFTER_FRAMES = 2000


class Compactor:
    """Runs :meth:`delete_archived` and :meth:`sweep` every ``interval`` seconds (0: never).

    Args:
        store: the database.
        writer: the writer, through which runs are deleted.
        hub: the browsers, told of each deleted run.
        interval: seconds between sweeps.
        thin_after: days after its end before a run is thinned, per project.
        delete_archived_after: days after it was archived before a run is deleted, per project.
        thin_points: the points a thinned series keeps.
        leases: this process's leases, when replicas share the database.
        clock: Unix time (injected by tests).

    Example:
        ```python
        compactor = Compactor(store, writer, hub, 30.0,
                              delete_archived_after=Retention.parse("30,golden=0"))
        await compactor.start()
        ```
    """

    def __init__(
        self,
        store: Store,
        writer: Writer,
        hub: Hub,
        interval: float,
        *,
        thin_after: Retention | None = None,
        delete_archived_after: Retention | None = None,
        thin_points: int = 10_000,
        leases: Leases | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store, self._series = store, store.series
        self._writer, self._hub, self._leases = writer, hub, leases
        self.interval = interval
        self._thin_after = thin_after or Retention()
        self._delete_after = delete_archived_after or Retention()
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
        if self._leases is not None:  # another replica deletes at once
            with contextlib.suppress(WriterClosed, StorageUnavailable):
                await self._leases.release(RETENTION)

    def sweep(self) -> int:
        """Thin the runs past their retention, then compact every run that is due; returns
        the frames merged."""
        now = self._clock()
        for run_id in self._series.runs_to_thin(now, self._thin_after):
            removed = self._series.thin(run_id, self._thin_points, now)
            log.info("thinned run %s: %d points left out", run_id, removed)
        merged = 0
        for due in self._series.runs_to_compact(REPLAY_FRAMES, LIVE_AFTER_FRAMES):
            merged += self._series.compact(due)
        return merged

    async def delete_archived(self) -> list[str]:
        """Delete the ended runs archived longer ago than their project's days, each with its
        points, events, alerts, notices and lease, and tell every browser that sees its
        project; returns their ids. With replicas, only the one that holds the lease does.
        Each run is deleted in a writer transaction of its own, only if it is still due then
        (a run brought back from the archive meanwhile is kept)."""
        policy = self._delete_after
        if not policy.applies:
            return []
        if self._leases is not None and not await self._leases.claim(RETENTION):
            return []
        now = self._clock()
        deleted = []
        for run_id in await asyncio.to_thread(self._store.runs.archived_to_delete, now, policy):
            project = await self._writer.submit(
                partial(self._store.delete_archived, run_id=run_id, now=now, after_days=policy)
            )
            if project is not None:
                self._hub.run_deleted(run_id, project)
                log.info("deleted run %s of project %r: archived past its days", run_id, project)
                deleted.append(run_id)
        return deleted

    async def _loop(self) -> None:
        while True:
            try:
                # Deleted first: nothing is spent compacting a run about to go.
                await self.delete_archived()
                merged = await asyncio.to_thread(self.sweep)
                if merged:
                    log.info("compacted %d stored frames", merged)
            except WriterClosed:  # the server is stopping
                return
            except Exception as exc:  # a database hiccup: the next sweep tries again
                log_failure(exc, "compaction failed; retrying in %.0f s", self.interval)
            await asyncio.sleep(self.interval)
