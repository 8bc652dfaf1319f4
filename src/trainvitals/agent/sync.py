"""Delivering the spools that ended processes left on disk: ``trainvitals sync``, and the
next run started on the machine.

A run whose process ends before the server acknowledged everything keeps the rest in its
spool directory (:mod:`trainvitals.agent.spool`), with a ``run.json`` holding the run's
``hello`` (its per-run secret included) and the server it was sent to. Delivering it is
what the process would have done had the server answered: the same hello (which creates
the run if the server never heard of it), then every frame in sequence order. The server
is idempotent on the run's sequence numbers, so a delivery cut short and started again, or
run twice, stores each frame once; the ``end`` frame among them gives the run its true
ending, even after the server gave it up as lost. The spool is deleted once the server has
acknowledged its last frame.

Example:
    ```python
    for directory in find_spools([default_spool_dir()]):
        delivery = deliver(load(directory), server="http://10.0.0.5:8600")
        print(delivery.summary())
    ```
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from trainvitals.agent.buffer import without_clocks
from trainvitals.agent.config import AgentConfig, run_ingest_url, websocket_url
from trainvitals.agent.connection import UNREACHABLE, connect_ingest, greet, read_ack
from trainvitals.agent.spool import Spool
from trainvitals.agent.spool_format import (
    META_FILE,
    Frame,
    SpoolMeta,
    claim,
    is_spool,
    read_segment,
    spool_roots,
)
from trainvitals.exceptions import ConfigurationError, SpoolError
from trainvitals.protocol import END, INGEST_PATH, HelloFrame

log = logging.getLogger("trainvitals")

#: Frames sent ahead of the server's acknowledgements: enough to keep the connection busy,
#: few enough that the acks waiting to be read never fill a buffer.
WINDOW = 64
#: Seconds to wait for one acknowledgement before giving the delivery up.
ACK_TIMEOUT = 30.0
#: ``run.json``'s layout.
META_VERSION = 1


def spool_meta(server: str, hello: HelloFrame) -> SpoolMeta:
    """What ``run.json`` holds: enough for another process to deliver the run's frames."""
    return {"version": META_VERSION, "server": server, "hello": hello}


@dataclass
class SpooledRun:
    """A run's spool left on disk, as :func:`load` reads it."""

    directory: Path
    server: str
    hello: HelloFrame
    #: What was unreadable, one line each (filled while :meth:`frames` reads).
    damage: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.hello["run_id"]

    @property
    def title(self) -> str:
        return f"run {self.hello['name']!r} of project {self.hello['project']!r} ({self.run_id})"

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*.seg"))

    def size(self) -> int:
        return sum(path.stat().st_size for path in self.segments())

    def frames(self) -> Iterator[Frame]:
        """Every readable frame once, in sequence order. A damaged segment gives the frames
        before the damage, and a line in :attr:`damage`; the next segments are read all
        the same."""
        self.damage.clear()
        last = 0
        for path in self.segments():
            try:
                for seq, text in read_segment(path):
                    if seq > last:  # the head holds frames a later segment may repeat
                        last = seq
                        yield seq, text
            except SpoolError as exc:
                self.damage.append(str(exc))


@dataclass
class Delivery:
    """What :func:`deliver` did."""

    run: SpooledRun
    server: str
    #: Frames sent, and those the server had already stored (not sent again).
    sent: int = 0
    already: int = 0
    last_seq: int = 0
    #: The run's end reason when the spool held its ``end`` frame.
    ended: str | None = None

    def summary(self) -> str:
        if self.sent:
            what = f"delivered {self.sent} frames (up to seq {self.last_seq}) to {self.server}"
        else:
            what = f"nothing left to deliver to {self.server}"
        if self.already:
            what += f"; {self.already} it had already"
        ending = (
            f"it ended {self.ended}"
            if self.ended
            else "its end was not spooled (the process was killed?): the server marks it lost"
        )
        return f"{self.run.title}: {what}; {ending}"


def load(directory: Path) -> SpooledRun:
    """Read a spool directory's ``run.json``.

    Raises:
        SpoolError: the directory holds no run.json, or one that cannot be used, or either
            could have been written by another user.
    """
    path = directory / META_FILE
    try:
        if not (_private(directory) and _private(path)):
            # What another user could write (a spool directory made ahead of us in a shared
            # temporary directory) would be sent under our token: never deliver it.
            raise SpoolError(
                f"{directory}: not delivered, it or its {META_FILE} is another user's or "
                "writable by others; delete it unless you know where it comes from"
            )
        meta = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SpoolError(
            f"{directory}: no {META_FILE}, so not a spool trainvitals sync can deliver (an "
            "older agent's, or not a spool)"
        ) from None
    except (OSError, ValueError) as exc:
        raise SpoolError(f"{path}: cannot be read as JSON ({exc})") from None
    hello = meta.get("hello") if isinstance(meta, dict) else None
    server = meta.get("server") if isinstance(meta, dict) else None
    if (
        not isinstance(hello, dict)
        or not isinstance(server, str)
        or not all(isinstance(hello.get(k), str) for k in ("run_id", "project", "name"))
    ):
        # Not the content itself: the hello holds the run's secret.
        raise SpoolError(
            f"{path}: expected a 'server' URL and a 'hello' with the run's 'run_id', 'project' "
            "and 'name'; something is missing"
        )
    return SpooledRun(directory, server, cast(HelloFrame, hello))


def _private(path: Path) -> bool:
    """Whether ``path`` is this user's and no one else may write it."""
    if not hasattr(os, "getuid"):  # Windows: a user's profile is private already
        return True
    status = path.stat()
    return status.st_uid == os.getuid() and not status.st_mode & 0o022


def find_spools(paths: Iterable[Path]) -> list[Path]:
    """The spool directories among ``paths``, or in them (a spool root), oldest first."""
    found: list[Path] = []
    for path in paths:
        if is_spool(path):
            found.append(path)
            continue
        try:
            children = [p for p in path.iterdir() if is_spool(p)]
        except OSError:
            continue
        found.extend(sorted(children, key=_changed))
    return list(dict.fromkeys(found))


def deliver(run: SpooledRun, server: str | None = None, token: str | None = None) -> Delivery:
    """Send ``run``'s spooled frames to ``server`` (default: the one it was spooled for),
    then delete the spool.

    Raises:
        SpoolError: another process holds the spool (its run lives), or the server refused
            the run; the spool stays.
        ConfigurationError: ``server`` is not a server URL.
        OSError, TimeoutError, websockets' ConnectionClosed and InvalidHandshake, and
        ProtocolError: the server could not be reached, or broke off; the spool stays.
    """
    with claim(run.directory) as mine:
        if not mine:
            raise SpoolError(
                f"{run.directory}: in use by the process whose run it is (it is still sending it)"
            )
        return _send(run, server or run.server, token)


def _send(run: SpooledRun, server: str, token: str | None) -> Delivery:
    """:func:`deliver`, the spool's lock held."""
    delivery = Delivery(run, server)
    last_text = ""  # the run's last frame: its end, if it ended
    # Without "accepts": the run's alerts are for the terminal that trained it, not this one.
    hello = cast(HelloFrame, {k: v for k, v in run.hello.items() if k != "accepts"})
    with connect_ingest(run_ingest_url(server, run.run_id), token) as ws:
        welcome = greet(ws, hello)
        stored, clocks = welcome.last_seq, welcome.clocks
        in_flight: deque[int] = deque()
        for seq, last_text in run.frames():
            if seq <= stored:
                delivery.already += 1
                continue
            ws.send(last_text if clocks else without_clocks(last_text))
            in_flight.append(seq)
            delivery.sent += 1
            delivery.last_seq = seq
            while len(in_flight) >= WINDOW:
                _acked(in_flight, read_ack(ws, ACK_TIMEOUT))
        while in_flight:
            _acked(in_flight, read_ack(ws, ACK_TIMEOUT))
    delivery.ended = _end_reason(last_text)
    shutil.rmtree(run.directory, ignore_errors=True)
    return delivery


def _acked(in_flight: deque[int], seq: int) -> None:
    while in_flight and in_flight[0] <= seq:
        in_flight.popleft()


def _end_reason(text: str) -> str | None:
    """The reason of the frame ``text`` when it is an ``end`` frame (the last a run packs)."""
    if not text:
        return None
    try:
        frame = json.loads(text)
    except ValueError:
        return None
    return str(frame.get("reason")) if frame.get("type") == END else None


def _changed(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# -- the next run started on the machine -----------------------------------------------------

_syncing: threading.Thread | None = None
_syncing_lock = threading.Lock()


def sync_in_background(config: AgentConfig, spool: Spool) -> threading.Thread | None:
    """Deliver, on a daemon thread, the spools that runs which ended left for ``config``'s
    server (those for other servers wait for ``trainvitals sync``), and delete the old ones
    that cannot be delivered. Started by each run unless one is at it already; a failure is
    one warning, never an error."""
    global _syncing
    with _syncing_lock:
        if _syncing is not None and _syncing.is_alive():
            return None
        _syncing = threading.Thread(
            target=_sync_leftovers, args=(config, spool), name="trainvitals-sync", daemon=True
        )
        _syncing.start()
        return _syncing


def _sync_leftovers(config: AgentConfig, spool: Spool) -> None:
    try:
        spool.remove_leftovers()
        ours = websocket_url(config.server, INGEST_PATH)
        failures: list[str] = []
        for directory in find_spools(spool_roots(config.spool_dir)):
            if directory.name == spool.run_id or not (directory / META_FILE).exists():
                continue
            try:
                with claim(directory) as mine:
                    if not mine or not (directory / META_FILE).exists():
                        continue  # its process lives, or another run delivers (delivered) it
                    run = load(directory)
                    if websocket_url(run.server, INGEST_PATH) != ours:
                        continue
                    delivery = _send(run, run.server, config.token)
            except (SpoolError, ConfigurationError, *UNREACHABLE) as exc:
                if directory.exists():  # else another run delivered it meanwhile
                    failures.append(f"{directory}: {type(exc).__name__}: {exc}")
                continue
            log.info("trainvitals: an earlier process's spool, %s", delivery.summary())
            for line in run.damage:
                log.warning("trainvitals: %s", line)
        if failures:
            log.warning(
                "trainvitals: could not deliver %d spool(s) earlier processes left (%s); "
                "`trainvitals sync` retries",
                len(failures),
                failures[0],
            )
    except Exception:  # telemetry never breaks training: one line, and the thread ends
        log.warning("trainvitals: delivering earlier runs' spools failed", exc_info=True)
