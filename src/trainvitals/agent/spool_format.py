"""A spool's files on disk, and where spools are.

A run's spool is ``<spool_dir>/<run id>/``: a ``lock`` file held with ``flock`` while the run
lives; ``run.json`` (mode 0600: the run's ``hello`` with its secret, and the server it was sent
to), enough for another process to deliver the frames; segments ``000001.seg``,
``000002.seg``, ... of records, each a header (payload length, CRC-32 of the payload, seq;
big-endian ``>IIQ``) and the frame's JSON text; and, once a run ended with frames the server
had not acknowledged, ``000000.seg``: those that were in memory. Reading every segment in name
order, skipping a seq not above the last one read, gives each frame once and in order. A
record cut short or failing its CRC ends its segment's reading.

:class:`~trainvitals.agent.spool.Spool` writes these files; :mod:`trainvitals.agent.sync`
reads those a process left behind.
"""

from __future__ import annotations

import getpass
import os
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TypedDict

from trainvitals.exceptions import SpoolError
from trainvitals.protocol import HelloFrame

#: A record's header: payload length, CRC-32 of the payload, sequence number.
HEADER = struct.Struct(">IIQ")
#: What another process needs to deliver a run's spool: its hello and its server.
META_FILE = "run.json"
#: The frames that were in memory when the run ended unacknowledged: the oldest.
HEAD_SEGMENT = "000000.seg"

Frame = tuple[int, str]  # (seq, JSON text)


class SpoolMeta(TypedDict):
    """What ``run.json`` holds: enough for another process to deliver the run's frames."""

    version: int  # of this layout
    server: str  # the base URL the run was sent to
    hello: HelloFrame  # with the run's secret: the file is its owner's alone


def record(seq: int, text: str) -> bytes:
    """One frame as a record: its header, then its text."""
    data = text.encode()
    return HEADER.pack(len(data), zlib.crc32(data), seq) + data


def fallback_root() -> Path:
    """Where a run spools when its spool directory cannot be written: the user's own
    directory under the system's temporary one."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a bare container
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"trainvitals-spool-{user}"


def spool_roots(root: Path) -> list[Path]:
    """Where runs' spools may be: ``root``, and the temporary directory a run falls back on
    when ``root`` cannot be written."""
    return list(dict.fromkeys((root, fallback_root())))


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
                record = next_record(reader)
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
        yield try_lock(lock)


def next_record(reader: IO[bytes]) -> Frame | str | None:
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


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` whole, readable by its owner only (it holds the run's secret)."""
    partial = path.with_suffix(".tmp")
    partial.unlink(missing_ok=True)  # the mode applies to a file created now
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        out.write(data)
    os.replace(partial, path)


def last_change(directory: Path) -> float:
    try:
        return max([directory.stat().st_mtime, *(p.stat().st_mtime for p in directory.iterdir())])
    except OSError:
        return time.time()  # vanishing as we look: someone else is tidying it


if sys.platform == "win32":

    def try_lock(handle: IO[bytes]) -> bool:
        return True  # no flock: leftovers are judged by age alone

else:
    import fcntl

    def try_lock(handle: IO[bytes]) -> bool:
        """Take the run's lock without waiting; False when another process holds it."""
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True
