"""The alert engine in the server: one detector and alert book per run, fed by ingest.

The detection itself is :mod:`trainvitals.detect` (pure, no I/O). This module gives each
run its state, persists every alert change through the writer together with its
notifications (one transaction: the outbox) and pushes it to browsers. A run's state is
rebuilt when it is first needed after a restart: its stored alerts are taken up and its last
frames replayed through a fresh detector, whose findings are discarded, so baselines are
warm and nothing fires twice.

The runs one training process makes (a loop of fits: its hello's ``process`` key) share the
memory rules and their alerts (:class:`~trainvitals.detect.memory.ProcessMemory`): one alert per
process and memory, carried from run to run (it moves to the newest run it spans and names them
all in ``evidence.runs``), closed when the process dies or makes no run for
:data:`PROCESS_IDLE` seconds. A process's runs are judged together on the replica that holds
its tracker: one whose runs land on several replicas is judged run by run on each.

Replicas sharing one database judge each run in one place: the process its agent said hello
to takes the run's lease (:mod:`~trainvitals.server.leases`), and one that held the run
before drops what it knew once its renewal finds the lease gone. A process that takes a run
it did not hold without a break rebuilds it from storage, as after a restart: the alerts the
other raised are taken up, not raised again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from trainvitals.detect import Alert, AlertBook, Change, Detector, Finding, RulesConfig
from trainvitals.detect.memory import PROCESS_RULES, ProcessMemory
from trainvitals.detect.numeric import cause_said
from trainvitals.detect.types import jsonable
from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.protocol import EndReason, SeqColumns
from trainvitals.server.leases import RUN, Leases
from trainvitals.server.live import Hub
from trainvitals.server.metrics import RunVitals
from trainvitals.server.notify import Notifier
from trainvitals.server.notify.messages import Notice
from trainvitals.server.storage import AlertRow, Silence
from trainvitals.server.storage.unit_of_work import UnitOfWork
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer, log_failure

log = logging.getLogger("trainvitals.server")

#: Frames of history replayed into a rebuilt detector: about ten minutes of an agent's frames
#: at its default of one a second (two at five a second)...
REPLAY_FRAMES = 600
#: ...and of each series at most this many points: twenty times the longest window a rule
#: counts in steps (500), and all of the once-a-second system readings (600 frames of a fast
#: step, whole, took 10x as long to replay: ``benchmarks/replay.py``).
REPLAY_POINTS = 10_000

#: A process that made no run for this many seconds since its last ended has ended too (its
#: loop finished): its memory alerts close. Fits of a loop follow each other within seconds;
#: an evaluation between them may take minutes.
PROCESS_IDLE = 900.0
#: Endings after which the process itself is gone (an exception may be caught by the loop).
_PROCESS_SURVIVES = (EndReason.COMPLETED.value, EndReason.EXCEPTION.value)
#: Why a process's alerts closed.
PROCESS_ENDED = "process ended"


@dataclass
class _Process:
    """A training process whose runs share their memory rules, and the runs running now."""

    memory: ProcessMemory
    open_runs: set[str]
    #: The run it last spoke through (alerts closed after its end are published on it).
    last: _RunAlerts
    idle_since: float | None = None


@dataclass
class _RunAlerts:
    run_id: str
    project: str
    name: str
    detector: Detector
    book: AlertBook
    autopsy: dict[str, Any] | None = None
    #: ``time.monotonic()`` when its lease was taken (a renewal older than that can't see it).
    leased_at: float = 0.0
    #: The process whose memory it is judged with: (project, process key), or None.
    process: tuple[str, str] | None = None


class AlertEngine:
    """Runs the rules on every run's stream and keeps their alerts."""

    def __init__(
        self,
        store: Store,
        writer: Writer,
        hub: Hub,
        rules: RulesConfig,
        leases: Leases,
        notifier: Notifier | None = None,
    ) -> None:
        self._store, self._writer, self._hub = store, writer, hub
        self._leases = leases
        self._notifier = notifier
        self.rules = rules
        self._runs: dict[str, _RunAlerts] = {}
        self._processes: dict[tuple[str, str], _Process] = {}
        self._loading: dict[str, asyncio.Task[_RunAlerts | None]] = {}
        self._renewer: asyncio.Task[None] | None = None
        # Runs whose health is to be read and pushed (run id: project), and who does it.
        self._health_due: dict[str, str] = {}
        self._health_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._renewer = asyncio.create_task(self._renew_forever(), name="trainvitals-leases")

    async def stop(self) -> None:
        """Stop renewing, and give the runs judged here up to whichever replica hears of
        them next."""
        for task in (self._renewer, self._health_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._runs:
            with contextlib.suppress(WriterClosed, StorageUnavailable):
                await self._leases.release(*(RUN + run_id for run_id in self._runs))

    # -- events from ingest and liveness ----------------------------------------------------

    async def opened(
        self, run: Mapping[str, Any], env: Mapping[str, Any], now: float, new: bool = False
    ) -> None:
        """A run's agent said hello: a ``new`` run, or one reconnecting (whose state may
        have to be rebuilt from storage)."""
        run_id = run["id"]
        if new or run_id in self._runs:
            leased_at = time.monotonic()
            if not await self._leases.take(RUN + run_id):
                # Another replica judged it since (or nobody did): what is here is stale.
                self._runs.pop(run_id, None)
            if new and run_id not in self._runs:  # nothing stored to rebuild from
                self._runs[run_id] = self._fresh(run, env, leased_at)
        state = await self._state(run_id)
        if state is None:
            return
        findings = state.detector.hello(int(run.get("last_step") or 0), now)
        crash = state.book.alerts.get(("crash", ""))
        if crash is not None and crash.state == "firing":  # a lost run speaks again
            findings.append(Finding("crash", "", False, crash.step, now))
        await self._apply(state, findings)
        await self._carry_process_alerts(state, now)
        await self._close_idle_processes(now)

    async def points(self, run_id: str, points: Mapping[str, SeqColumns]) -> None:
        """A frame's points (as ingest holds them: with their clocks) to the run's rules."""
        state = await self._state(run_id)
        if state is not None:
            await self._apply(state, state.detector.feed(points))

    async def stalled(
        self, run_id: str, step: int, when: float, idle: float, threshold: float, stacks: str
    ) -> None:
        state = await self._state(run_id)
        if state is not None:
            await self._apply(state, state.detector.stalled(step, when, idle, threshold, stacks))

    async def autopsy(self, run_id: str, step: int, report: dict[str, Any]) -> None:
        """The agent's answer to where the first NaN/Inf came from: it joins the evidence of
        the run's ``nonfinite`` alert (now, or when that alert fires)."""
        state = await self._state(run_id)
        if state is None:
            return
        state.autopsy = {"step": step, **report}
        alert = state.book.alerts.get(("nonfinite", ""))
        if alert is not None and alert.state == "firing":
            await self._publish(state, [("updated", alert)])

    async def ended(
        self, run_id: str, reason: str, when: float, traceback: str | None = None
    ) -> None:
        """The run ended (or was given up as lost): a crash alert unless it completed, and
        every other firing alert is closed (not resolved: no channel hears of it)."""
        state = await self._state(run_id)
        if state is None:
            return
        await self._apply(state, state.detector.ended(reason, when, traceback))
        closed = state.book.close_all(when, keep=("crash",))
        process = self._process_of(state)
        if process is not None:
            process.open_runs.discard(run_id)
            if reason not in _PROCESS_SURVIVES:  # the process died with its run
                closed += process.memory.book.close_all(when, reason=PROCESS_ENDED)
                self._processes.pop(state.process or ("", ""), None)
            elif not process.open_runs:
                process.idle_since = when
        await self._publish(state, [("closed", alert) for alert in closed])
        if self._runs.pop(run_id, None) is not None:
            await self._leases.release(RUN + run_id)

    def vitals(self, limit: int) -> tuple[list[RunVitals], int]:
        """The latest system readings of the ``limit`` runs opened last whose detectors this
        process holds, and how many others it holds (for ``GET /metrics``). On the event loop:
        copies, taken between two frames."""
        judged = list(self._runs.values())
        shown = judged[-limit:] if limit > 0 else []
        return [
            RunVitals(
                s.run_id,
                s.project,
                s.name,
                dict(s.detector.context.latest),
                s.detector.context.step_time,
            )
            for s in reversed(shown)
        ], len(judged) - len(shown)

    # -- people ------------------------------------------------------------------------------

    async def acknowledge(self, alert_id: str, by: str | None) -> AlertRow | None:
        now = time.time()
        stored = await self._writer.submit(
            partial(self._store.alerts.acknowledge, alert_id=alert_id, when=now, by=by)
        )
        if stored is None:
            return None
        self._changed_by_people(stored, acknowledged_at=now, acknowledged_by=by)
        return stored

    async def silence(
        self, alert_id: str, duration: float, by: str | None
    ) -> tuple[AlertRow, Silence] | None:
        """Silence the alert's rule and subject on its run for ``duration`` seconds."""
        stored = await asyncio.to_thread(self._store.alerts.get_alert, alert_id)
        if stored is None:
            return None
        now = time.time()
        silence = Silence(
            id=uuid.uuid4().hex,
            run_id=stored["run_id"],
            rule=stored["rule"],
            subject=stored["subject"],
            until=now + duration,
            created_at=now,
            created_by=by,
        )
        await self._writer.submit(partial(self._store.alerts.add_silence, silence=silence))
        stored["silenced_until"] = silence["until"]
        self._changed_by_people(stored, silenced_until=silence["until"])
        return stored, silence

    # -- internals ---------------------------------------------------------------------------

    def _changed_by_people(self, stored: AlertRow, **changes: float | str | None) -> None:
        """An alert acknowledged or silenced (``stored`` as it now is): the alert the run's
        book keeps, where the run is judged here, takes the ``changes``; browsers hear."""
        state = self._runs.get(stored["run_id"])
        kept = None if state is None else self._book_of(state, stored["rule"]).find(stored["id"])
        if kept is not None:
            for name, value in changes.items():
                setattr(kept, name, value)
        self._hub.alert(stored)

    async def _state(self, run_id: str) -> _RunAlerts | None:
        state = self._runs.get(run_id)
        if state is not None:
            return state
        task = self._loading.get(run_id)
        if task is None:
            task = self._loading[run_id] = asyncio.create_task(self._rebuild(run_id))
        try:
            return await asyncio.shield(task)
        finally:
            self._loading.pop(run_id, None)

    def _fresh(
        self, run: Mapping[str, Any], env: Mapping[str, Any], leased_at: float
    ) -> _RunAlerts:
        """A run's detector and book; its memory rules are its process's, where it names one."""
        run_id, project, name = run["id"], run["project"], run["name"]
        settings = self.rules.for_project(project)
        key: str = run.get("process_key") or ""  # the run's process, when its hello named one
        process = self._processes.get((project, key))
        memory = process.memory if process is not None else ProcessMemory(settings) if key else None
        detector = Detector(settings, env, memory=None if memory is None else memory.rules)
        state = _RunAlerts(run_id, project, name, detector, AlertBook(settings.alerts))
        state.leased_at = leased_at
        if memory is None:
            return state
        if process is None:
            process = self._processes[(project, key)] = _Process(memory, set(), state)
        memory.join(run_id, name, detector.context)
        process.open_runs.add(run_id)
        process.last, process.idle_since = state, None
        state.process = (project, key)
        return state

    def _process_of(self, state: _RunAlerts) -> _Process | None:
        return None if state.process is None else self._processes.get(state.process)

    def _book_of(self, state: _RunAlerts, rule: str) -> AlertBook:
        """Where a rule's alerts of this run are kept: its process's book for memory."""
        process = self._process_of(state)
        return process.memory.book if process is not None and rule in PROCESS_RULES else state.book

    async def _carry_process_alerts(self, state: _RunAlerts, now: float) -> None:
        """A process's run began: its firing memory alerts move to it and name it."""
        process = self._process_of(state)
        if process is None:
            return
        carried = [a for a in process.memory.book.alerts.values() if a.state == "firing"]
        carried = [a for a in carried if a.run_id != state.run_id]
        for alert in carried:
            alert.updated_time = now
        await self._publish(state, [("updated", alert) for alert in carried])

    async def _close_idle_processes(self, now: float) -> None:
        """Close the memory alerts of processes that made no run for :data:`PROCESS_IDLE`."""
        for key, process in list(self._processes.items()):
            if process.idle_since is not None and now - process.idle_since > PROCESS_IDLE:
                del self._processes[key]
                closed = process.memory.book.close_all(now, reason=PROCESS_ENDED)
                await self._publish(process.last, [("closed", alert) for alert in closed])

    async def _rebuild(self, run_id: str) -> _RunAlerts | None:
        run = await asyncio.to_thread(self._store.runs.get_run, run_id, job=False, metrics=False)
        if run is None:
            return None
        leased_at = time.monotonic()
        # Taken before reading: whatever the previous holder stores from now on, it stores
        # before its renewal tells it to stop, and a write that races this read is stored.
        await self._leases.take(RUN + run_id)
        state = self._fresh(run, run["env"], leased_at)
        history = await asyncio.to_thread(
            self._store.series.recent_points, run_id, REPLAY_FRAMES, REPLAY_POINTS
        )
        # Seconds of work for a long history: off the event loop that serves every other run.
        await asyncio.to_thread(state.detector.replay, history)
        stored = await asyncio.to_thread(
            self._store.alerts.list_alerts, run_id=run_id, limit=10_000
        )
        alerts = [Alert.from_dict(a) for a in stored]
        process = self._process_of(state)
        state.book.load(a for a in alerts if process is None or a.rule not in PROCESS_RULES)
        if process is not None:
            process.memory.book.load(a for a in alerts if a.rule in PROCESS_RULES)
        self._runs[run_id] = state
        return state

    async def _apply(self, state: _RunAlerts, findings: Iterable[Finding]) -> None:
        changes = [self._book_of(state, finding.rule).apply(finding) for finding in findings]
        await self._publish(state, [change for change in changes if change is not None])

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self._leases.ttl / 3)
            started = time.monotonic()
            try:
                held = await self._leases.renew(RUN)
            except WriterClosed:
                return
            except Exception as exc:  # a database hiccup must not end the renewals
                log_failure(exc, "renewing the runs' leases failed")
                continue
            for run_id, state in list(self._runs.items()):
                if state.leased_at < started and RUN + run_id not in held:
                    log.info("run %s is judged by another server now", state.name)
                    self._runs.pop(run_id, None)
            try:
                await self._close_idle_processes(time.time())
            except WriterClosed:
                return

    async def _publish(self, state: _RunAlerts, changes: list[tuple[Change, Alert]]) -> None:
        if not changes:
            return
        silences = None
        if any(kind == "fired" for kind, _ in changes):  # made on any replica: stored
            silences = await asyncio.to_thread(self._store.alerts.active_silences, time.time())
        published: list[tuple[Change, Alert]] = []
        for kind, alert in changes:
            alert.run_id, alert.project, alert.run_name = state.run_id, state.project, state.name
            if alert.rule == "nonfinite" and state.autopsy is not None:
                alert.evidence["autopsy"] = jsonable(state.autopsy)
                said = cause_said(state.autopsy)
                if said is not None:  # the first cause, with its own remedy
                    alert.message, alert.hint = said
            process = self._process_of(state)
            if process is not None and alert.rule in PROCESS_RULES:
                alert.evidence["runs"] = process.memory.spans(alert.id)
            if kind == "fired":
                alert.silenced_until = _silenced_until(alert, silences or [])
            # A snapshot: the book goes on changing its alerts while these are written and sent.
            published.append((kind, Alert.from_dict(alert.as_dict())))
        notices = await self._writer.submit(
            partial(_save_all, self._store, published, self._notifier)
        )
        if self._notifier is not None:
            self._notifier.deliver(notices)
        for kind, alert in published:
            if kind == "fired":
                log.warning("alert %s on run %s: %s", alert.rule, alert.run_name, alert.message)
            self._hub.alert(alert.as_dict())
        # The run's health (worst, rules, firing) follows its alerts into open runs lists:
        # read off this path, for every run whose alerts changed meanwhile in one query, so
        # that a storm of alerts (a sweep finding 200 runs lost) is not slowed run by run.
        self._health_due[state.run_id] = state.project
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.create_task(self._push_health(), name="trainvitals-health")

    async def _push_health(self) -> None:
        while self._health_due:
            due, self._health_due = self._health_due, {}
            try:
                health = await asyncio.to_thread(self._store.alerts.health, list(due))
            except Exception as exc:  # stored and sent: a list shows it at its next read
                log_failure(exc, "reading the health of %d runs failed", len(due))
                return
            for run_id, project in due.items():
                if run_id in health:
                    self._hub.health_changed(run_id, project, health[run_id])


def _silenced_until(alert: Alert, silences: list[Silence]) -> float | None:
    subject = (alert.run_id, alert.rule, alert.subject)
    untils = [s["until"] for s in silences if (s["run_id"], s["rule"], s["subject"]) == subject]
    return max(untils, default=None)


def _save_all(
    store: Store,
    changes: list[tuple[Change, Alert]],
    notifier: Notifier | None,
    work: UnitOfWork,
) -> list[Notice]:
    """Store alert changes, and their notifications in the same transaction (the outbox)."""
    for _, alert in changes:
        store.alerts.save_alert(work, alert.as_dict())
    return notifier.enqueue(work, changes) if notifier is not None else []
