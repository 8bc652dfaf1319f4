"""The server side of one agent connection: frames in, stored, acknowledged, published.

Sans-I/O apart from the awaits on the writer: the websocket route feeds text frames to
:meth:`IngestSession.handle` and sends back whatever reply it returns, or closes the
connection with the code of the :class:`IngestRejected` it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from functools import partial

from trainvitals.exceptions import FrameError, IngestRejected
from trainvitals.protocol import (
    ACCEPTS_ALERTS,
    ACK,
    CLOSE_INVALID_PAYLOAD,
    CLOSE_POLICY_VIOLATION,
    CLOSE_TOO_BIG,
    FEATURE_CLOCKS,
    PROTOCOL_VERSION,
    WELCOME,
    RunStatus,
)
from trainvitals.server import run_lifecycle as lifecycle
from trainvitals.server.alerts import AlertEngine
from trainvitals.server.auth import LOCAL
from trainvitals.server.connections import OpenRuns
from trainvitals.server.live import Hub
from trainvitals.server.liveness import Liveness
from trainvitals.server.metrics import Metrics
from trainvitals.server.quotas import Caps, Quotas
from trainvitals.server.run_lifecycle import ALIVE, FINAL, Effect, RunState, transition
from trainvitals.server.schemas import (
    MAX_SEQ_AHEAD,
    Autopsy,
    End,
    Heartbeat,
    Hello,
    Points,
    Stall,
    parse_frame,
)
from trainvitals.server.storage import RunEnd, RunSummary, run_summary
from trainvitals.server.storage.tokens import Principal, Role
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer

log = logging.getLogger("trainvitals.server")

#: Frames this big or bigger are parsed on a worker thread.
_PARSE_ON_LOOP = 64 * 1024
#: How long a watchdog's hello waits for the dead process's connection to be read to its
#: end (a network cut leaves it open with nothing more to come: the watchdog goes on).
DRAIN_FOR = 15.0


class IngestSession:
    """State of one agent connection: which run it speaks for and how far it got."""

    def __init__(
        self,
        store: Store,
        writer: Writer,
        hub: Hub,
        liveness: Liveness,
        alerts: AlertEngine,
        max_frame_bytes: int,
        who: Principal = LOCAL,
        quotas: Quotas | None = None,
        metrics: Metrics | None = None,
        open_runs: OpenRuns | None = None,
    ) -> None:
        self._store = store
        self._open_runs = open_runs or OpenRuns()
        #: The run this connection's hello named, and the event to set when it closes.
        self._holding: tuple[str, asyncio.Event] | None = None
        self._metrics = metrics
        self._who = who
        self._quotas = quotas or Quotas(Caps())
        self._series: set[str] = set()  # the run's series names, for the cap
        self._alerts = alerts
        self._writer = writer
        self._hub = hub
        self._liveness = liveness
        self._max_frame_bytes = max_frame_bytes
        self.run: RunSummary | None = None  # the run as browsers see it
        self._state = RunState(RunStatus.RUNNING)
        self._last_seq = 0
        #: Whether the agent takes its run's ``alert`` frames (its hello said so; never a
        #: watchdog's connection, which waits for one ack only).
        self.hears_alerts = False

    async def handle(self, text: str) -> str | None:
        """Process one text frame; returns the reply to send, if any."""
        size = len(text.encode())
        if size > self._max_frame_bytes:
            raise IngestRejected(
                CLOSE_TOO_BIG,
                f"frame of {size} bytes exceeds the {self._max_frame_bytes}-byte limit",
            )
        self._quotas.received(self._who.token_id, size)
        try:
            # A big frame is parsed on a worker thread: the event loop serves every run.
            frame = (
                parse_frame(text)
                if size < _PARSE_ON_LOOP
                else await asyncio.to_thread(parse_frame, text)
            )
        except FrameError as exc:
            raise IngestRejected(CLOSE_INVALID_PAYLOAD, str(exc)) from None
        if self._metrics is not None:
            self._metrics.frame(frame.type)
        if isinstance(frame, Hello):
            return await self._hello(frame)
        if self.run is None:
            raise IngestRejected(
                CLOSE_POLICY_VIOLATION, f"expected a 'hello' frame first, got {frame.type!r}"
            )
        if isinstance(frame, Heartbeat):
            await self._heartbeat()
            return None
        if frame.seq <= self._last_seq:  # a replay of something already stored
            return _ack(frame.seq)
        if frame.seq > self._last_seq + MAX_SEQ_AHEAD:
            raise IngestRejected(
                CLOSE_INVALID_PAYLOAD,
                f"seq {frame.seq} is more than {MAX_SEQ_AHEAD} ahead of the last stored "
                f"({self._last_seq})",
            )
        if isinstance(frame, Points):
            return await self._points(frame)
        if isinstance(frame, Stall):
            return await self._stall(frame)
        if isinstance(frame, Autopsy):
            return await self._autopsy(frame)
        return await self._end(frame)

    async def _hello(self, hello: Hello) -> str:
        if self.run is not None:
            raise IngestRejected(CLOSE_POLICY_VIOLATION, "a connection speaks for one run only")
        if not self._who.may(Role.INGEST, hello.project):
            raise IngestRejected(
                CLOSE_POLICY_VIOLATION,
                f"this token may not send runs of project {hello.project[:40]!r}",
            )
        if hello.watchdog:
            await self._drain(hello.run_id)
        # Held from here, before anything the hello awaits: a killed process's hello may wait
        # behind a loaded writer while its watchdog's arrives, and that watchdog must wait for
        # this connection's frames too. A hello refused below lets go when its connection
        # closes, a moment later.
        self._holding = (hello.run_id, self._open_runs.opened(hello.run_id))
        known = await asyncio.to_thread(
            self._store.runs.get_run, hello.run_id, job=False, metrics=False
        )
        if known is None:
            await self._quotas.new_run(self._who.token_id)
        else:
            self._series = set(known["series"])
        row = await self._writer.submit(
            partial(self._store.runs.open_run, hello=hello.model_dump(), now=time.time())
        )
        if not row["owned"]:
            why = (
                f"is not of project {hello.project[:40]!r}: a run keeps the project of its "
                "first hello"
                if row["project"] != hello.project
                else "belongs to another process: its hello lacks the run's secret"
            )
            raise IngestRejected(CLOSE_POLICY_VIOLATION, f"run {hello.run_id[:20]!r} {why}")
        self._last_seq = int(row["last_seq"])
        self.run = run_summary(row)
        self.hears_alerts = ACCEPTS_ALERTS in hello.accepts and not hello.watchdog
        # Storage applied the hello (a lost run is running again); what follows from it:
        stored = RunState(RunStatus(row["status"]), row["last_step"], row["end_reason"])
        self._state, effects = transition(stored, lifecycle.Hello())
        self._apply(effects, time.time())
        self._hub.run_changed(self.run.copy(), fresh=True)
        if self._state.status in ALIVE:
            await self._alerts.opened(self.run, hello.env, time.time(), new=row["created"])
        welcome = {
            "type": WELCOME,
            "v": PROTOCOL_VERSION,
            "run_id": hello.run_id,
            "last_seq": self._last_seq,
            "features": [FEATURE_CLOCKS],
        }
        if row["secret"] is not None:  # issued now: the agent sends it in every later hello
            welcome["run_secret"] = row["secret"]
        return json.dumps(welcome)

    def close(self) -> None:
        """The connection closed: a watchdog waiting for it goes on."""
        if self._holding is not None:  # set at the hello
            self._open_runs.closed(*self._holding)
            self._holding = None

    async def _drain(self, run_id: str) -> None:
        """A watchdog's hello: wait until the run's connections open here now have closed
        (what its dead process sent is then stored), or :data:`DRAIN_FOR` seconds."""
        waiting = (
            self._metrics.watchdogs_waiting.track_inprogress()
            if self._metrics is not None
            else contextlib.nullcontext()
        )
        with waiting:
            drained = await self._open_runs.drained(run_id, DRAIN_FOR)
        if not drained:
            log.warning(
                "run %s: its watchdog reports while a connection of the run is still open "
                "after %g s",
                run_id,
                DRAIN_FOR,
            )

    async def _points(self, frame: Points) -> str:
        assert self.run is not None
        run_id = self.run["id"]
        # One form from here on: the frame's clocks, each held once, shared by storage, the
        # live push and the detector (``protocol.ClockedSeries``).
        points = frame.columns()
        new = points.keys() - self._series
        if new:
            self._quotas.series(len(self._series) + len(new))
            self._series.update(new)
        now = time.time()
        last_step = await self._writer.submit(
            partial(
                self._store.series.add_points, run_id=run_id, seq=frame.seq, points=points, now=now
            )
        )
        self._last_seq = frame.seq
        if self._metrics is not None:
            self._metrics.points.inc(sum(len(values) for _, values in points.series.values()))
        self._hub.points(run_id, points)
        if self._liveness.revive(run_id):  # given up as lost while it was streaming
            await self._revive(now)
        if last_step is not None:
            self._advance(lifecycle.Progress(last_step), now)
        self.run["last_seen"] = now
        if self._state.status in ALIVE:
            self._liveness.seen(run_id, now)
        self._hub.run_changed(self.run.copy())
        if self._state.status not in FINAL:  # an ended run's points judge nothing more
            await self._alerts.points(run_id, points)
        return _ack(frame.seq)

    async def _stall(self, frame: Stall) -> str:
        assert self.run is not None
        report = (
            f"No training step for {frame.idle:.1f} s (threshold {frame.threshold:.1f} s).\n\n"
            f"{frame.stacks}"
        )
        await self._writer.submit(
            partial(
                self._store.runs.mark_stalled,
                run_id=self.run["id"],
                seq=frame.seq,
                when=frame.time,
                report=report,
            )
        )
        self._last_seq = frame.seq
        self._advance(lifecycle.Stall(), frame.time)
        self._hub.run_changed(self.run.copy())
        await self._alerts.stalled(
            self.run["id"],
            int(self.run["last_step"] or 0),
            frame.time,
            frame.idle,
            frame.threshold,
            frame.stacks,
        )
        return _ack(frame.seq)

    async def _autopsy(self, frame: Autopsy) -> str:
        assert self.run is not None
        await self._writer.submit(
            partial(
                self._store.runs.add_event,
                run_id=self.run["id"],
                seq=frame.seq,
                kind=frame.type,
                step=frame.step,
                when=frame.time,
                data=frame.report,
            )
        )
        self._last_seq = frame.seq
        await self._alerts.autopsy(self.run["id"], frame.step, frame.report)
        return _ack(frame.seq)

    async def _heartbeat(self) -> None:
        assert self.run is not None
        now = time.time()
        if self._state.status in ALIVE:
            self._liveness.seen(self.run["id"], now)
        await self._writer.submit(partial(self._store.runs.touch, run_id=self.run["id"], now=now))
        self.run["last_seen"] = now
        self._hub.run_changed(self.run.copy())

    async def _end(self, frame: End) -> str:
        assert self.run is not None
        end = RunEnd(reason=frame.reason, ended_at=frame.time, traceback=frame.traceback)
        await self._writer.submit(
            partial(self._store.runs.end_run, run_id=self.run["id"], seq=frame.seq, end=end)
        )
        self._last_seq = frame.seq
        effects = self._advance(lifecycle.End(frame.reason), end.ended_at)
        if Effect.ENDED in effects:
            self.run["end_reason"], self.run["ended_at"] = end.reason, end.ended_at
        self._hub.run_changed(self.run.copy())
        if Effect.ENDED in effects:
            await self._alerts.ended(self.run["id"], end.reason, end.ended_at, end.traceback)
        return _ack(frame.seq)

    async def _revive(self, now: float) -> None:
        """The run was marked lost (a server pause, a network cut) yet its points arrive:
        it is running again, and its crash alert for the silence resolves."""
        assert self.run is not None
        revived = await self._writer.submit(
            partial(self._store.runs.revive, run_id=self.run["id"], now=now)
        )
        if not revived:
            return
        lost = RunState(RunStatus.LOST, self._state.last_step)
        self._state, effects = transition(lost, lifecycle.Hello())
        self.run["status"] = self._state.status.value
        self.run["end_reason"] = self.run["ended_at"] = None
        self._apply(effects, now)
        await self._alerts.opened(self.run, {}, now)

    def _advance(self, event: lifecycle.Event, now: float) -> tuple[Effect, ...]:
        """Move the run through its lifecycle; the browsers' summary follows."""
        assert self.run is not None
        self._state, effects = transition(self._state, event)
        self.run["status"] = self._state.status.value
        if self._state.last_step is not None:
            self.run["last_step"] = self._state.last_step
        self._apply(effects, now)
        return effects

    def _apply(self, effects: tuple[Effect, ...], now: float) -> None:
        assert self.run is not None
        if Effect.WATCH in effects:
            self._liveness.seen(self.run["id"], now)
        if Effect.UNWATCH in effects:
            self._liveness.ended(self.run["id"])


def _ack(seq: int) -> str:
    return json.dumps({"type": ACK, "seq": seq})
