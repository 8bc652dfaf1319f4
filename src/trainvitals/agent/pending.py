"""Frames waiting for the server's acknowledgement: in memory first, then on disk.

The sender keeps a run's unacknowledged frames in memory up to ``memory_bytes``. A longer
outage would grow that without bound, so beyond it frames go to the run's
:class:`~trainvitals.agent.spool.Spool` and come back into memory, oldest first, as the server
acknowledges what memory holds. Frames keep the sequence numbers they were given when packed,
so the server's idempotence on (run, seq) holds across replays.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from trainvitals.agent.spool_format import Frame

if TYPE_CHECKING:
    from trainvitals.agent.spool import Spool

log = logging.getLogger("trainvitals")


class PendingFrames:
    """Numbered frames the server has not acknowledged, oldest first.

    Up to ``memory_bytes`` of JSON text stays in memory; more goes to ``spool``, and comes
    back into memory in order as acknowledgements make room. Memory always holds the oldest
    frames, so sending from memory alone keeps sequence order. The sender thread does all
    but :meth:`keep`, which the thread finishing the run may call meanwhile: a lock keeps
    the two apart.

    Args:
        memory_bytes: text kept in memory before frames spill to disk.
        spool: where they spill; None drops them instead (counted in :attr:`dropped`).

    Example:
        ```python
        pending = PendingFrames(32 * 2**20, Spool(root, run.id, max_bytes=2**30))
        pending.push(1, frame_text)
        for seq, text in pending.take():  # frames not handed out yet, oldest first
            ws.send(text)
        pending.ack(1)  # the server stored everything up to 1
        ```
    """

    def __init__(self, memory_bytes: int, spool: Spool | None = None) -> None:
        self.memory_bytes = memory_bytes
        self.spool = spool
        self._in_flight: deque[Frame] = deque()  # handed out by take(), not acknowledged
        self._queued: deque[Frame] = deque()  # in memory, not handed out
        self._bytes = 0
        self._dropped = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._in_flight) + len(self._queued) + self.spooled

    @property
    def spooled(self) -> int:
        """Frames on disk now."""
        return 0 if self.spool is None else len(self.spool)

    @property
    def in_memory_bytes(self) -> int:
        return self._bytes

    @property
    def dropped(self) -> int:
        """Frames lost so far: over the spool's cap, or no spool to put them in."""
        return self._dropped + (0 if self.spool is None else self.spool.dropped)

    def push(self, seq: int, text: str) -> None:
        """Add the newest frame (``seq`` above every frame pushed before)."""
        with self._lock:
            self._push(seq, text)

    def _push(self, seq: int, text: str) -> None:
        if not self.spooled and self._bytes + len(text) <= self.memory_bytes:
            self._queued.append((seq, text))
            self._bytes += len(text)
            return
        if self.spool is None:
            self._dropped += 1
            if self._dropped == 1:
                log.warning(
                    "trainvitals: over %d bytes of frames wait for the server and there is "
                    "no spool; dropping the newest",
                    self.memory_bytes,
                )
        else:
            self.spool.append(seq, text)
        self._refill()

    def take(self) -> list[Frame]:
        """The frames in memory not handed out yet, now counted as in flight."""
        with self._lock:
            frames = list(self._queued)
            self._in_flight.extend(frames)
            self._queued.clear()
            return frames

    def rewind(self) -> None:
        """A new connection: every frame in memory is to be sent again."""
        with self._lock:
            self._in_flight.extend(self._queued)
            self._queued, self._in_flight = self._in_flight, deque()

    def ack(self, seq: int) -> None:
        """The server stored every frame up to ``seq``: forget them."""
        with self._lock:
            while True:
                for frames in (self._in_flight, self._queued):
                    while frames and frames[0][0] <= seq:
                        self._bytes -= len(frames.popleft()[1])
                if self._in_flight or self._queued or not self.spooled:
                    break
                self._refill()
            self._refill()

    def keep(self) -> Path | None:
        """The run ends with these frames unacknowledged: put those in memory on disk
        beside the spooled ones, for ``trainvitals sync`` or the next run to deliver.
        Returns the spool's directory, or None when there is no spool or it cannot be
        written (the frames are then lost with the process)."""
        with self._lock:
            if self.spool is None:
                return None
            kept = self.spool.keep([*self._in_flight, *self._queued])
            return self.spool.directory if kept else None

    def release(self) -> None:
        """Leave the spool on disk, for another process (:meth:`keep` wrote it)."""
        with self._lock:
            if self.spool is not None:
                self.spool.release()

    def close(self) -> None:
        """Delete the spool's files."""
        with self._lock:
            if self.spool is not None:
                self.spool.close()

    def _refill(self) -> None:
        if self.spool is None or not self.spooled or self._bytes >= self.memory_bytes:
            return
        for seq, text in self.spool.read(self.memory_bytes - self._bytes):
            self._queued.append((seq, text))
            self._bytes += len(text)
