"""Frames waiting for the server's acknowledgement: in memory first, then on disk.

The sender keeps a run's unacknowledged frames in memory up to ``spool_after_bytes``. A
longer outage would grow that without bound, so beyond it frames go to the run's
:class:`Spool`, an append-only set of segment files, and come back into memory, oldest first,
as the server acknowledges what memory holds. Frames keep the sequence numbers they were
given when packed, so the server's idempotence on (run, seq) holds across replays.

Only the sender thread touches a :class:`Spool` (through :class:`PendingFrames`, whose lock
also lets a finishing thread :meth:`~PendingFrames.keep` what memory holds); the training
thread never waits on the disk.

A spool is capped at ``spool_max_bytes``. Beyond the cap its oldest segment is deleted, with
one warning: the frames that matter most after a long outage are the latest (what the run is
doing now, how it ended), and the in-memory head still holds the start of the outage.

On disk a run's spool is ``<spool_dir>/<run id>/``: a ``lock`` file held with ``flock`` while
the run lives; ``run.json`` (mode 0600: the run's ``hello`` with its secret, and the server it
was sent to), enough for another process to deliver the frames; segments ``000001.seg``,
``000002.seg``, ... of records, each a header (payload length, CRC-32 of the payload, seq;
big-endian ``>IIQ``) and the frame's JSON text; and, once a run ended with frames the server
had not acknowledged, ``000000.seg``: those that were in memory. Reading every segment in name
order, skipping a seq not above the last one read, gives each frame once and in order. A
record cut short or failing its CRC ends its segment's reading. A spool is deleted once all
is acknowledged; one a process left behind is delivered by ``trainvitals sync`` or by the
next run started on the machine (:mod:`trainvitals.agent.sync`).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainvitals.exceptions import SpoolError

log = logging.getLogger("trainvitals")

#: A record's header: payload length, CRC-32 of the payload, sequence number.
HEADER = struct.Struct(">IIQ")
#: A spool from before ``run.json`` (it cannot be delivered) is removed once it has not
#: changed for this long (seconds).
STALE_AFTER = 3600.0
#: What another process needs to deliver a run's spool: its hello and its server.
META_FILE = "run.json"
#: The frames that were in memory when the run ended unacknowledged: the oldest.
HEAD_SEGMENT = "000000.seg"
#: Largest segment file; smaller for small caps, so the cap drops a small part at a time.
MAX_SEGMENT_BYTES = 16 * 2**20

Frame = tuple[int, str]  # (seq, JSON text)


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
        self, root: Path, run_id: str, max_bytes: int, meta: Mapping[str, Any] | None = None
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
        data = text.encode()
        size = HEADER.size + len(data)
        if size > self.max_bytes or not self._open():
            self.dropped += 1
            return False
        while self._segments and self._bytes + size > self.max_bytes:
            self._drop_oldest_segment()
        try:
            if self._writer is None or self._segments[-1].size >= self.segment_bytes:
                self._roll()
            assert self._writer is not None
            self._writer.write(HEADER.pack(len(data), zlib.crc32(data), seq) + data)
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
                    data = text.encode()
                    out.write(HEADER.pack(len(data), zlib.crc32(data), seq) + data)
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
                if now - _last_change(directory) < STALE_AFTER:
                    continue
                try:
                    with (directory / "lock").open("rb") as lock:
                        if not _try_lock(lock):
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
        for root in (self.root, _fallback_root()):
            directory = root / self.run_id
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                lock = (directory / "lock").open("ab")
                if self.meta is not None:
                    _write_private(directory / META_FILE, json.dumps(self.meta).encode())
            except OSError as exc:
                errors.append(f"{root}: {exc.strerror or exc}")
                continue
            _try_lock(lock)
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
            record = _next_record(self._reader)
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


def _fallback_root() -> Path:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a bare container
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"trainvitals-spool-{user}"


def spool_roots(root: Path) -> list[Path]:
    """Where runs' spools may be: ``root``, and the temporary directory a run falls back on
    when ``root`` cannot be written."""
    return list(dict.fromkeys((root, _fallback_root())))


def is_spool(directory: Path) -> bool:
    """Whether ``directory`` holds a run's spool, and nothing else."""
    try:
        names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
    except OSError:
        return False
    return "lock" in names and all(
        n in ("lock", META_FILE) or n.endswith((".seg", ".tmp")) for n in names
    )


def read_segment(path: Path) -> Iterator[Frame]:
    """The records of one segment file, in order.

    Raises:
        SpoolError: after the last whole record, when what follows it is cut short or fails
            its CRC (the rest of the file cannot be framed); the message says where.
    """
    try:
        with path.open("rb") as reader:
            while True:
                offset = reader.tell()
                record = _next_record(reader)
                if record is None:
                    return
                if isinstance(record, str):
                    size = path.stat().st_size
                    raise SpoolError(
                        f"{path}: the record at byte {offset} {record}; the {size - offset} "
                        "bytes from there on cannot be read"
                    )
                yield record
    except OSError as exc:
        raise SpoolError(f"{path}: cannot be read ({exc.strerror or exc})") from exc


@contextmanager
def claim(directory: Path) -> Iterator[bool]:
    """Hold the spool's lock while the block runs, if no other process does (a live run's
    spool is its process's to send): whether it is held."""
    try:
        lock = (directory / "lock").open("ab")
    except OSError as exc:
        raise SpoolError(f"{directory}: cannot be opened ({exc.strerror or exc})") from None
    with lock:
        yield _try_lock(lock)


def _next_record(reader: IO[bytes]) -> Frame | str | None:
    """The next record; None at the end of the file; what is wrong with it if damaged."""
    header = reader.read(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        return "is cut short in its header"
    length, crc, seq = HEADER.unpack(header)
    data = reader.read(length)
    if len(data) < length:
        return f"is cut short ({len(data)} of its {length} bytes)"
    if zlib.crc32(data) != crc:
        return "fails its CRC check"
    try:
        return seq, data.decode()
    except UnicodeDecodeError:
        return "is not UTF-8 text"


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` whole, readable by its owner only (it holds the run's secret)."""
    partial = path.with_suffix(".tmp")
    partial.unlink(missing_ok=True)  # the mode applies to a file created now
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        out.write(data)
    os.replace(partial, path)


def _last_change(directory: Path) -> float:
    try:
        return max([directory.stat().st_mtime, *(p.stat().st_mtime for p in directory.iterdir())])
    except OSError:
        return time.time()  # vanishing as we look: someone else is tidying it


if sys.platform == "win32":

    def _try_lock(handle: IO[bytes]) -> bool:
        return True  # no flock: leftovers are judged by age alone

else:
    import fcntl

    def _try_lock(handle: IO[bytes]) -> bool:
        """Take the run's lock without waiting; False when another process holds it."""
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True
