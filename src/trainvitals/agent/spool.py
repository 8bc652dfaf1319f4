"""One run's frames on disk while the server cannot take them.

:class:`~trainvitals.agent.pending.PendingFrames` keeps a run's unacknowledged frames in
memory up to ``spool_after_bytes``; beyond it frames go to the run's :class:`Spool`, an
append-only set of segment files (laid out as :mod:`trainvitals.agent.spool_format` says), and
come back into memory, oldest first, as the server acknowledges what memory holds.

Only the sender thread touches a :class:`Spool` (through :class:`PendingFrames`, whose lock
also lets a finishing thread :meth:`~PendingFrames.keep` what memory holds); the training
thread never waits on the disk.

A spool is capped at ``spool_max_bytes``. Beyond the cap its oldest segment is deleted, with
one warning: the frames that matter most after a long outage are the latest (what the run is
doing now, how it ended), and the in-memory head still holds the start of the outage. A spool
is deleted once all is acknowledged; one a process left behind is delivered by ``trainvitals
sync`` or by the next run started on the machine (:mod:`trainvitals.agent.sync`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trainvitals.agent.pending import PendingFrames
from trainvitals.agent.spool_format import (
    HEAD_SEGMENT,
    META_FILE,
    Frame,
    SpoolMeta,
    fallback_root,
    is_spool,
    last_change,
    next_record,
    record,
    spool_roots,
    try_lock,
    write_private,
)

# PendingFrames and spool_roots are imported from here by the run and ``trainvitals sync``.
__all__ = ["STALE_AFTER", "PendingFrames", "Spool", "spool_roots"]

log = logging.getLogger("trainvitals")

#: A spool from before ``run.json`` (it cannot be delivered) is removed once it has not
#: changed for this long (seconds).
STALE_AFTER = 3600.0
#: Largest segment file; smaller for small caps, so the cap drops a small part at a time.
MAX_SEGMENT_BYTES = 16 * 2**20


@dataclass
class _Segment:
    path: Path
    size: int = 0  # bytes of whole records written
    records: int = 0


class Spool:
    """One run's frames on disk, first in, first out, at most ``max_bytes``.

    Nothing is created until the first :meth:`append`. When ``root`` cannot be written, the
    spool goes to the system's temporary directory; when that fails too, frames are dropped
    with one warning.

    Args:
        root: the directory holding every run's spool (``$TRAINVITALS_SPOOL_DIR``).
        run_id: names this run's subdirectory.
        max_bytes: the most bytes this run's segment files may take.
        meta: written to ``run.json`` (mode 0600) with the directory: what delivering the
            frames from another process needs (see :func:`trainvitals.agent.sync.spool_meta`).

    Example:
        ```python
        spool = Spool(Path("/scratch/spool"), run.id, max_bytes=2**30)
        spool.append(7, '{"type": "points", "v": 1, "seq": 7, "series": {}}')
        spool.read(max_bytes=2**20)  # [(7, '{"type": "points", ...}')]
        spool.close()  # deletes the run's files
        ```
    """

    def __init__(
        self, root: Path, run_id: str, max_bytes: int, meta: SpoolMeta | None = None
    ) -> None:
        self.root = root
        self.run_id = run_id
        self.max_bytes = max_bytes
        self.meta = meta
        self.segment_bytes = max(1, min(max_bytes // 16, MAX_SEGMENT_BYTES))
        #: Frames lost to the cap, to a full disk or to a damaged record.
        self.dropped = 0
        self.directory: Path | None = None
        self._lock: IO[bytes] | None = None
        self._unavailable = False
        self._segments: deque[_Segment] = deque()
        self._numbered = 0  # the last segment's number
        self._bytes = 0
        self._count = 0  # records written and not yet read or dropped
        self._writer: IO[bytes] | None = None
        self._reader: IO[bytes] | None = None
        self._read_records = 0  # of the first segment
        self._cap_reported = False
        self._write_failure_reported = False
        #: Set by :meth:`keep`: read segments stay on disk until all is acknowledged.
        self._kept = False

    def __len__(self) -> int:
        return self._count

    @property
    def size(self) -> int:
        """Bytes the spool's segment files take on disk now."""
        return self._bytes

    def append(self, seq: int, text: str) -> bool:
        """Write one frame at the end; returns False when it had to be dropped."""
        packed = record(seq, text)
        size = len(packed)
        if size > self.max_bytes or not self._open():
            self.dropped += 1
            return False
        while self._segments and self._bytes + size > self.max_bytes:
            self._drop_oldest_segment()
        try:
            if self._writer is None or self._segments[-1].size >= self.segment_bytes:
                self._roll()
            assert self._writer is not None
            self._writer.write(packed)
            self._writer.flush()  # the reader has its own handle on the file
        except OSError as exc:
            self._write_failed(exc)
            self.dropped += 1
            return False
        segment = self._segments[-1]
        segment.size += size
        segment.records += 1
        self._bytes += size
        self._count += 1
        return True

    def read(self, max_bytes: int) -> list[Frame]:
        """Take the oldest frames out, about ``max_bytes`` of text, at least one if any."""
        frames: list[Frame] = []
        taken = 0
        while self._count and (not frames or taken < max_bytes):
            head = self._segments[0]
            if self._read_records == head.records:  # read to its end
                self._remove_head()
                continue
            frame = self._read_record(head)
            if frame is None:  # cut short or damaged: the rest of this segment is lost
                lost = head.records - self._read_records
                self.dropped += lost
                self._count -= lost
                self._read_records = head.records
                continue
            frames.append(frame)
            taken += len(frame[1])
            self._read_records += 1
            self._count -= 1
        if not self._count:
            self._discard_segments()  # all read: the next outage starts a fresh segment
        return frames

    def keep(self, head: list[Frame]) -> bool:
        """The run ends with frames unacknowledged: write ``head`` (those in memory, older
        than any segment's) where another process will find them, and from now on leave
        segments on disk when they are read. Returns False when nothing could be written.
        A second call replaces the first's head."""
        if not self._open():
            return False
        assert self.directory is not None
        self._kept = True
        path = self.directory / HEAD_SEGMENT
        partial = path.with_suffix(".tmp")
        try:
            with partial.open("wb") as out:
                for seq, text in head:
                    out.write(record(seq, text))
            os.replace(partial, path)  # whole or not at all
        except OSError as exc:
            partial.unlink(missing_ok=True)
            self._write_failed(exc)
            return False
        return True

    def release(self) -> None:
        """Let go of the spool, leaving it on disk for another process to deliver."""
        self._close_writer()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def close(self) -> None:
        """Delete the run's spool: its frames are acknowledged, or will never be."""
        self._discard_segments(unlink=True)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def remove_leftovers(self, now: float | None = None) -> list[Path]:
        """Delete the spools that cannot be delivered, of dead processes: no ``run.json``
        (written before there was one), lock free, untouched for STALE_AFTER seconds.

        Only directories holding nothing but a spool's files are touched, so a spool
        directory pointed at a shared place cannot cost anyone else's files.
        """
        removed = []
        now = time.time() if now is None else now
        for root in spool_roots(self.root):
            try:
                candidates = [p for p in root.iterdir() if p.name != self.run_id and is_spool(p)]
            except OSError:
                continue
            for directory in candidates:
                if (directory / META_FILE).exists():
                    continue  # deliverable: trainvitals sync, or the next run, sends it
                if now - last_change(directory) < STALE_AFTER:
                    continue
                try:
                    with (directory / "lock").open("rb") as lock:
                        if not try_lock(lock):
                            continue  # a live process owns it
                        shutil.rmtree(directory, ignore_errors=True)
                except OSError:
                    continue
                removed.append(directory)
        return removed

    # -- files ---------------------------------------------------------------------------------

    def _open(self) -> bool:
        if self.directory is not None:
            return True
        if self._unavailable:
            return False
        errors = []
        for root in (self.root, fallback_root()):
            directory = root / self.run_id
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                lock = (directory / "lock").open("ab")
                if self.meta is not None:
                    write_private(directory / META_FILE, json.dumps(self.meta).encode())
            except OSError as exc:
                errors.append(f"{root}: {exc.strerror or exc}")
                continue
            try_lock(lock)
            self.directory, self._lock = directory, lock
            if errors:
                log.warning("trainvitals: cannot spool to %s; spooling to %s", errors[0], root)
            return True
        self._unavailable = True
        log.warning(
            "trainvitals: cannot spool frames to disk (%s); frames beyond the in-memory "
            "limit are dropped. Set $TRAINVITALS_SPOOL_DIR to a writable directory",
            "; ".join(errors),
        )
        return False

    def _roll(self) -> None:
        assert self.directory is not None
        self._close_writer()
        self._numbered += 1
        segment = _Segment(self.directory / f"{self._numbered:06d}.seg")
        self._writer = segment.path.open("wb")
        self._segments.append(segment)

    def _read_record(self, segment: _Segment) -> Frame | None:
        try:
            if self._reader is None:
                self._reader = segment.path.open("rb")
            record = next_record(self._reader)
        except OSError:
            return None
        return record if isinstance(record, tuple) else None

    def _drop_oldest_segment(self) -> None:
        head = self._segments[0]
        lost = head.records - self._read_records
        self.dropped += lost
        self._count -= lost
        if not self._cap_reported:
            self._cap_reported = True
            log.warning(
                "trainvitals: the spool of run %s reached its cap of %d bytes "
                "($TRAINVITALS_SPOOL_MAX_BYTES); dropping its oldest frames to keep the latest",
                self.run_id,
                self.max_bytes,
            )
        self._remove_head(unlink=True)

    def _remove_head(self, unlink: bool = False) -> None:
        head = self._segments.popleft()
        if not self._segments:
            self._close_writer()  # it was the one being written
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._read_records = 0
        self._bytes -= head.size
        if unlink or not self._kept:  # kept: its frames may be in memory only, not acknowledged
            head.path.unlink(missing_ok=True)

    def _discard_segments(self, unlink: bool = False) -> None:
        self._close_writer()
        while self._segments:
            self._remove_head(unlink)
        self._count = 0

    def _write_failed(self, exc: OSError) -> None:
        """Cut the torn record off (a full disk), so that the next one starts clean."""
        segment = self._segments[-1] if self._segments else None
        self._close_writer()
        if segment is not None:
            try:
                os.truncate(segment.path, segment.size)
            except OSError:
                pass  # the reader stops at the whole records it was told of
        if not self._write_failure_reported:
            self._write_failure_reported = True
            log.warning("trainvitals: cannot write the spool (%s); dropping frames", exc)

    def _close_writer(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                pass
            self._writer = None
