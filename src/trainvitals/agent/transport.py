"""The sender thread: ships recorded points to the server over one websocket.

Training never waits on this module. The training thread only appends to a
:class:`~trainvitals.agent.buffer.PointBuffer`; one named daemon thread looks every
``read_interval`` seconds (running the run's tick: the device ring's read, the hang check),
drains the buffer every ``flush_interval`` seconds, or at once when what it holds is urgent
(:mod:`~trainvitals.agent.urgency`), numbers each frame, sends it and forgets it once the
server acknowledges it. Frames not yet acknowledged wait in
:class:`~trainvitals.agent.pending.PendingFrames` (memory, then a spool on disk during a long
outage) and are re-sent in order after a reconnect; the server drops the ones it already
stored (it is idempotent on the run's sequence numbers), so an outage costs nothing but a
delay. Network trouble is logged once per outage, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path

from websockets.exceptions import InvalidURI
from websockets.sync.client import ClientConnection

from trainvitals.agent.buffer import PointBuffer, encode_points, points_frames, without_clocks
from trainvitals.agent.config import DEFAULT_SPOOL_AFTER_BYTES
from trainvitals.agent.connection import UNREACHABLE, ack_seq, connect_ingest, decode, greet
from trainvitals.agent.pending import PendingFrames
from trainvitals.backoff import backoff_delays
from trainvitals.json_types import JsonObject
from trainvitals.protocol import ACK, HEARTBEAT, PROTOCOL_VERSION, HelloFrame, end_frame

# UNREACHABLE is imported from here by ``trainvitals sync``.
__all__ = ["KEEP_JOIN", "UNREACHABLE", "Sender"]

log = logging.getLogger("trainvitals")

#: The most seconds :meth:`Sender.keep` waits for the sender thread to stop (it may be in the
#: middle of opening a connection, up to 5 s; it lets go of the spool once it stops).
KEEP_JOIN = 1.0
#: How often :meth:`Sender.wait` looks whether the server became unreachable (seconds).
_WAIT_SLICE = 0.1

#: Every sender of this process, for :func:`_leave_connections_to_the_parent`.
_senders: weakref.WeakSet[Sender] = weakref.WeakSet()


def _leave_connections_to_the_parent() -> None:
    """In a child forked from the training process (a data loader's worker), close the
    child's copies of the senders' sockets. A child that held one would keep the run's
    connection open after the training process is killed: the server would not see it end,
    and the watchdog's report, which waits for that connection to close, would wait its
    longest (15 s). The parent's sockets are untouched; nothing is sent."""
    for sender in list(_senders):
        held = sender._socket
        if held is None:
            continue
        try:
            fd = held.detach()  # the child's object lets go of the descriptor, then it closes
            if fd >= 0:
                os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_leave_connections_to_the_parent)


class Sender:
    """Sends one run's frames from a background thread named ``trainvitals-sender``.

    Args:
        url: the server's ingest websocket URL (``ws://host:port/api/v1/ingest``).
        hello: the run's ``hello`` frame, sent first on every connection.
        buffer: where the training thread records points.
        flush_interval: the most seconds a point waits before it is sent, unless urgent.
        read_interval: seconds between looks (the tick, then a send if one is due or the
            buffer is urgent); at most ``flush_interval``, which it is by default.
        token: sent as ``Authorization: Bearer <token>`` when set.
        heartbeat_interval: seconds without anything sent before a ``heartbeat`` goes out, so
            the server knows the process lives while no step completes.
        tick: called on this thread at every look, connected or not (the run's reads and
            hang check: this thread keeps running while the training thread is stuck).
        pending: where unacknowledged frames wait (default: 32 MiB in memory, no spool).
        keepalive: seconds between the connection's keepalive pings (default: websockets' own,
            20 s; websockets before 15 sends none).
        on_done: called on this thread once the ``end`` is acknowledged.
        on_message: called on this thread with each frame from the server other than a
            welcome or an ack (an ``alert``); frames of a type nobody handles are ignored.
    """

    def __init__(
        self,
        url: str,
        hello: HelloFrame,
        buffer: PointBuffer,
        flush_interval: float = 1.0,
        token: str | None = None,
        heartbeat_interval: float = 5.0,
        tick: Callable[[], None] | None = None,
        pending: PendingFrames | None = None,
        read_interval: float | None = None,
        keepalive: float | None = None,
        on_done: Callable[[], None] | None = None,
        on_message: Callable[[JsonObject], None] | None = None,
    ) -> None:
        self._url = url
        self._on_message = on_message
        self._on_done = on_done
        self._keepalive = keepalive
        self._hello = hello
        self._buffer = buffer
        self._flush_interval = flush_interval
        self._read_interval = min(read_interval or flush_interval, flush_interval)
        self._next_send = 0.0  # time.monotonic() from which points are due to go
        self._heartbeat_interval = heartbeat_interval
        self._tick = tick
        self._events: deque[JsonObject] = deque()  # numbered frames other than points
        self._token = token
        self._pending = PendingFrames(DEFAULT_SPOOL_AFTER_BYTES) if pending is None else pending
        self._next_seq = 1
        self._end: tuple[str, float, str | None] | None = None  # reason, time, traceback
        self._end_packed = False
        self._closing = threading.Event()
        self._done = threading.Event()
        self._wake = threading.Event()
        self._outage_reported = False
        #: Why the last connection failed (``ConnectionRefusedError: ...``), or None.
        self.last_error: str | None = None
        self._connected = False
        #: Packing numbers frames: the sender thread's, or :meth:`keep`'s at the end.
        self._packing = threading.Lock()
        #: Set by keep() when no connection is up: the thread stops, the spool is let go.
        self._handed_over = threading.Event()
        #: Whether the last server to welcome this sender reads ``points`` with clocks.
        self._clocks = False
        self._socket: socket.socket | None = None  # the connection's, while it is open
        self._thread = threading.Thread(target=self._run, name="trainvitals-sender", daemon=True)
        _senders.add(self)

    def start(self) -> None:
        self._thread.start()

    def close(
        self,
        reason: str,
        when: float,
        traceback: str | None,
        timeout: float,
        unreachable: float | None = None,
    ) -> bool:
        """Queue the ``end`` frame, then :meth:`wait` for everything to be acked.

        Returns whether every frame reached the server. The thread keeps trying in the
        background after a timeout (it is a daemon: it dies with the process), until
        :meth:`keep` hands what is left over to the disk.
        """
        self._end = (reason, when, traceback)
        self._closing.set()
        self._wake.set()
        return self.wait(timeout, unreachable)

    def wait(self, timeout: float, unreachable: float | None = None) -> bool:
        """Wait up to ``timeout`` s for the ``end`` :meth:`close` queued to be acknowledged,
        and no longer than ``unreachable`` s once the server is known to be unreachable
        (there is no point holding the end of training hostage to it); whether it is."""
        start = time.monotonic()
        while not self._handed_over.is_set():
            waited = time.monotonic() - start
            limit = timeout if unreachable is None or self.connected else min(timeout, unreachable)
            if self._done.wait(max(0.0, min(limit - waited, _WAIT_SLICE))):
                return True
            if time.monotonic() - start >= limit:
                return False
        return self._done.is_set()

    def hurry(self) -> None:
        """Send what the buffer holds at the next look, not at the next send: mark it urgent,
        and look now (on this thread, the look under way sends it: no second look)."""
        self._buffer.hurry()
        if threading.current_thread() is not self._thread:
            self._wake.set()

    def due(self) -> bool:
        """Whether the look under way (or the next) packs a frame: points are due, or
        urgent, or an event or the end is waiting."""
        return bool(
            time.monotonic() >= self._next_send
            or self._buffer.urgent
            or self._events
            or self._closing.is_set()
        )

    def send_event(self, frame: JsonObject) -> None:
        """Queue a frame (e.g. a ``stall``) to be numbered and sent after the points so far."""
        self._events.append(frame)
        self._wake.set()

    def keep(self) -> Path | None:
        """The run ends with frames unacknowledged: pack what is left (the end :meth:`close`
        queued included) and keep every unacknowledged frame on disk, where ``trainvitals
        sync`` or the next run started on the machine delivers it from. Returns the spool's
        directory, or None when it could not be written. Called by the thread finishing the
        run.

        With no connection up, the sender stops and lets go of the spool (:attr:`handed_over`):
        it is theirs now, even while this process lives on (a notebook's kernel). With one up
        (a slow server), it goes on sending; the spool goes once all is acknowledged."""
        self._pack_due()
        kept = self._pending.keep()
        if self._connected:
            return kept
        self._handed_over.set()
        self._wake.set()
        if self._thread.is_alive():
            if threading.current_thread() is not self._thread:
                self._thread.join(KEEP_JOIN)  # it lets go of the spool as it stops
        else:
            self._pending.release()
        return kept

    @property
    def handed_over(self) -> bool:
        """Whether :meth:`keep` stopped the sender: the spool is left to others to deliver."""
        return self._handed_over.is_set()

    @property
    def connected(self) -> bool:
        """Whether the last connection attempt succeeded (the server is reachable)."""
        return not self._outage_reported

    @property
    def unacknowledged(self) -> int:
        return len(self._pending) + (0 if self._end_packed or self._end is None else 1)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._send_until_done()
        finally:
            if self._handed_over.is_set():  # its spool is for trainvitals sync, or the next run
                self._pending.release()

    def _send_until_done(self) -> None:
        delays = backoff_delays()
        while not self._handed_over.is_set():
            try:
                if self._connection():
                    self._pending.close()
                    if self._on_done is not None:  # before a waiter in close() or wait() goes on
                        self._on_done()
                    self._done.set()
                return
            except UNREACHABLE as exc:
                self._report_outage(exc)
            except InvalidURI as exc:  # cannot get better by retrying
                log.warning("trainvitals: not sending telemetry: %s", exc)
                return
            except Exception:  # never let telemetry die silently, never raise into training
                log.exception("trainvitals: sender failed; retrying")
            if self._connected:  # a connection that worked starts the backoff afresh
                delays = backoff_delays()
                self._connected = False
            self._wait_packing(next(delays))

    def _wait_packing(self, delay: float) -> None:
        """Wait ``delay`` s before reconnecting, packing frames each interval meanwhile, so
        points leave the training process's buffer for the spool at the usual pace."""
        deadline = time.monotonic() + delay
        while True:
            self._pack()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._wake.wait(min(self._read_interval, remaining)):
                self._wake.clear()  # urgent points and events go to the spool at once;
                if self._closing.is_set():  # only the end cuts the backoff short
                    break

    def _connection(self) -> bool:
        """One connection; whether the run's end was acknowledged on it (else :meth:`keep`
        stopped it)."""
        with connect_ingest(self._url, self._token, self._keepalive) as ws:
            self._socket = ws.socket
            try:
                return self._converse(ws)
            finally:
                self._socket = None

    def _converse(self, ws: ClientConnection) -> bool:
        """Hello, then frames out and acks in until the run's ``end`` is acknowledged (True),
        or :meth:`keep` has put what is left on disk (False)."""
        welcome = greet(ws, self._hello)
        if welcome.run_secret is not None:  # issued by the server: every later hello
            self._hello = {**self._hello, "run_secret": welcome.run_secret}
        # Clocks only where this server reads them; frames packed with them for an earlier
        # connection lose them again on the way to one that does not (a rolled-back server).
        self._clocks = welcome.clocks
        self._pending.rewind()
        self._pending.ack(welcome.last_seq)
        self._connected = True
        self.last_error = None
        if self._outage_reported:
            log.warning(
                "trainvitals: reconnected to %s; resending %d frames (%d from the spool)",
                self._url,
                len(self._pending),
                self._pending.spooled,
            )
            self._outage_reported = False
        last_send = time.monotonic()
        next_pack = 0.0
        while True:
            if time.monotonic() >= next_pack or self._closing.is_set():
                self._pack()
                next_pack = time.monotonic() + self._read_interval
            for _, text in self._pending.take():
                ws.send(text if self._clocks else without_clocks(text))
                last_send = time.monotonic()
            if time.monotonic() - last_send >= self._heartbeat_interval:
                ws.send(json.dumps({"type": HEARTBEAT, "v": PROTOCOL_VERSION, "time": time.time()}))
                last_send = time.monotonic()
            if self._end_packed and not self._pending:
                return True
            if self._handed_over.is_set():
                return False
            if self._closing.is_set() or self._pending.spooled:
                # Flushing, or replaying the spool as acks make room: block on acks
                # rather than polling.
                self._read_acks(ws, timeout=self._read_interval)
            else:
                self._read_acks(ws, timeout=0)
                self._wake.wait(self._read_interval)
                self._wake.clear()
                next_pack = 0.0  # an interval has passed, or an event is waiting

    def _read_acks(self, ws: ClientConnection, timeout: float) -> None:
        while True:
            try:
                frame = decode(ws.recv(timeout=timeout))
            except TimeoutError:
                return
            if frame.get("type") == ACK:
                self._pending.ack(ack_seq(frame))
            elif self._on_message is not None:
                try:
                    self._on_message(frame)
                except Exception:  # what the server says must never end the sender
                    log.exception("trainvitals: cannot handle a %r frame", frame.get("type"))
            timeout = 0

    def _pack(self) -> None:
        if self._tick is not None:
            try:
                self._tick()
            except Exception:
                log.exception("trainvitals: hang check failed")
        if self.due():
            self._pack_due()

    def _pack_due(self) -> None:
        with self._packing:
            self._next_send = time.monotonic() + self._flush_interval
            points = self._buffer.drain()
            if points:
                for frame in points_frames(points, self._next_seq, self._clocks):
                    self._pending.push(frame["seq"], encode_points(frame))
                    self._next_seq = frame["seq"] + 1
            while self._events:
                event = {**self._events.popleft(), "v": PROTOCOL_VERSION, "seq": self._next_seq}
                self._pending.push(self._next_seq, json.dumps(event))
                self._next_seq += 1
            if self._closing.is_set() and not self._end_packed and self._end is not None:
                end = end_frame(self._next_seq, *self._end)
                self._pending.push(self._next_seq, json.dumps(end))
                self._next_seq += 1
                self._end_packed = True

    def _report_outage(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        if not self._outage_reported:
            log.warning(
                "trainvitals: cannot reach %s (%s: %s); training continues, "
                "telemetry is kept (in memory, then spooled to disk) and sent when the "
                "server is back",
                self._url,
                type(exc).__name__,
                exc,
            )
            self._outage_reported = True
