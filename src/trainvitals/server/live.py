"""Fan-out of live updates to browsers connected to ``WS /api/v1/live``, and of each run's
firing alerts to its own agent (``WS /api/v1/ingest``, an agent that accepts them).

Ingest never waits on a browser: each browser has a bounded queue drained by its own task,
and a browser that falls that far behind is disconnected (1013) and reloads from the API.
Run-list changes (a run's summary, or its health when an alert about it changed) are
coalesced and pushed every ``runs_push_interval`` seconds; points go at once, and only to
the browsers that subscribed to that run: in the layout of the agent's frame, each clock once,
to those that asked (``?clocks=1``, the dashboard), each series with its own steps and times to
the others.

With a :class:`~trainvitals.server.broker.Broker` (``serve --broker``), every message goes
through it, so the browsers of every replica get it, this one's included; without, it goes
straight to this process's browsers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast

import orjson

from trainvitals.protocol import ALERT, PROTOCOL_VERSION, ClockedSeries, SeqColumns
from trainvitals.server.broker import (
    ALERTS,
    DELETED,
    INTERRUPTED,
    POINTS,
    REVOKED,
    RUNS,
    Broker,
)
from trainvitals.server.storage import RunHealth, RunSummary

#: The fields of a run people change from the dashboard (``PATCH /api/v1/runs/{id}``).
EDITABLE = frozenset({"name", "tags", "notes", "archived"})
#: What an agent is told of its run's alert: enough to log it, not its evidence (stacks).
_AGENT_ALERT_FIELDS = (
    "id", "run_id", "project", "run_name", "rule", "subject", "severity", "message", "hint",
    "step", "time",
)  # fmt: skip
#: Alerts waiting for one agent connection; past these it is closed (1013) and reconnects.
_AGENT_QUEUE = 256


class Subscriber:
    """One browser connection's outbox and subscriptions."""

    def __init__(
        self,
        queue_size: int,
        project: str | None = None,
        max_bytes: int = 64 * 2**20,
        clocks: bool = False,
    ) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=queue_size)
        #: Bytes waiting in the queue: bounded too (a few big messages can be gigabytes).
        self.queued_bytes = 0
        self._max_bytes = max_bytes
        self.runs: set[str] = set()
        #: The one project this browser sees, or None for every project.
        self.project = project
        #: Whether it takes ``points`` messages with clocks (it connected with ``?clocks=1``).
        self.clocks = clocks
        self.overflowed = asyncio.Event()
        #: Set with ``overflowed`` when live messages may have been lost on the way (the
        #: broker was cut off): the browser is closed to reconnect and reload, not as slow.
        self.interrupted = False

    def offer(self, message: str) -> None:
        if self.queued_bytes + len(message) > self._max_bytes:
            self.overflowed.set()
            return
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            self.overflowed.set()
            return
        self.queued_bytes += len(message)

    def taken(self, message: str) -> None:
        """``message`` left the queue for the browser."""
        self.queued_bytes -= len(message)


class Hub:
    """Routes run and point updates to subscribed browsers."""

    def __init__(
        self,
        queue_size: int = 2000,
        runs_push_interval: float = 0.5,
        queue_bytes: int = 64 * 2**20,
        broker: Broker | None = None,
        on_revoked: Callable[[str], object] | None = None,
    ) -> None:
        self._broker = broker
        #: Called with a token's id when it is revoked (here, or on another replica).
        self._on_revoked = on_revoked
        #: Browsers here watching each run (with a broker: the runs whose points it receives).
        self._watched: dict[str, int] = {}
        self._queue_bytes = queue_bytes
        self._subscribers: set[Subscriber] = set()
        self._queue_size = queue_size
        self._interval = runs_push_interval
        self._dirty_runs: dict[str, RunSummary] = {}
        #: Runs whose health changed since the last push: run id -> (project, health).
        self._dirty_health: dict[str, tuple[str, RunHealth]] = {}
        #: Set when something waits to be pushed: the push loop sleeps while nothing changes.
        self._due = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Agent connections here that take their run's alerts, by run id.
        self._agents: dict[str, set[Subscriber]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._push_runs_forever(), name="trainvitals-live-runs")
        if self._broker is not None:
            self._broker.start(self.received)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._broker is not None:
            await self._broker.stop()

    @property
    def browsers(self) -> int:
        """Browser connections subscribed to live updates."""
        return len(self._subscribers)

    def subscribe(self, project: str | None = None, *, clocks: bool = False) -> Subscriber:
        """A browser connection; ``clocks``: it takes ``points`` messages with clocks."""
        subscriber = Subscriber(self._queue_size, project, self._queue_bytes, clocks)
        self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)
        for run_id in list(subscriber.runs):
            self.unwatch(subscriber, run_id)

    def agent_listens(self, run_id: str) -> Subscriber:
        """An agent connection of ``run_id`` here takes its run's firing alerts from now on."""
        subscriber = Subscriber(_AGENT_QUEUE, max_bytes=2**20)
        self._agents.setdefault(run_id, set()).add(subscriber)
        return subscriber

    def agent_left(self, run_id: str, subscriber: Subscriber) -> None:
        listeners = self._agents.get(run_id)
        if listeners is not None:
            listeners.discard(subscriber)
            if not listeners:
                del self._agents[run_id]

    def watch(self, subscriber: Subscriber, run_id: str) -> None:
        """``subscriber`` gets the points of ``run_id`` from now on."""
        if run_id in subscriber.runs:
            return
        subscriber.runs.add(run_id)
        self._watched[run_id] = self._watched.get(run_id, 0) + 1
        if self._watched[run_id] == 1 and self._broker is not None:
            self._broker.watch(POINTS + run_id)

    def unwatch(self, subscriber: Subscriber, run_id: str) -> None:
        if run_id not in subscriber.runs:
            return
        subscriber.runs.discard(run_id)
        self._watched[run_id] -= 1
        if not self._watched[run_id]:
            del self._watched[run_id]
            if self._broker is not None:
                self._broker.unwatch(POINTS + run_id)

    def run_changed(self, run: RunSummary, *, fresh: bool = False) -> None:
        """Queue a run summary for the next coalesced push to every browser.

        What people edit of a run (:data:`EDITABLE`) is pushed only from a ``fresh`` summary,
        read from the database just now: an ingest session's copy of a run renamed since
        would undo the rename in every browser. Browsers keep what they had of those fields."""
        self._due.set()
        if fresh:
            self._dirty_runs[run["id"]] = run
            return
        update = {k: v for k, v in run.items() if k not in EDITABLE}
        self._dirty_runs[run["id"]] = cast(
            RunSummary, {**self._dirty_runs.get(run["id"], {}), **update}
        )

    def health_changed(self, run_id: str, project: str, health: RunHealth) -> None:
        """Queue a run's health (an alert about it changed) for the next coalesced push: in
        its summary when that goes too, else alone as ``{"id", "project", "health"}``."""
        self._dirty_health[run_id] = (project, health)
        self._due.set()

    def run_deleted(self, run_id: str, project: str) -> None:
        """Tell every browser that sees ``project`` (on every replica) that the run is gone."""
        self._dirty_runs.pop(run_id, None)
        self._dirty_health.pop(run_id, None)
        message = json.dumps({"type": "deleted", "run_id": run_id, "project": project})
        if self._broker is not None:
            self._broker.publish(DELETED, message)
        else:
            self._offer_alert(message, project)

    def token_revoked(self, token_id: str) -> None:
        """Tell every replica that ``token_id`` is revoked, so that each closes its
        websockets: this one at once (whether or not Redis is reachable), the others through
        the broker (this one hears it again, and has nothing more to close)."""
        if self._on_revoked is not None:
            self._on_revoked(token_id)
        if self._broker is not None:
            self._broker.publish(REVOKED, token_id)

    def alert(self, alert: Mapping[str, Any]) -> None:
        """Push an alert change to every browser (alerts are few; every page shows them)."""
        message = json.dumps({"type": "alert", "alert": alert})
        if self._broker is not None:
            self._broker.publish(ALERTS, message)
        else:
            self._offer_alert(message, alert.get("project"))
            self._tell_agents(alert)

    def _tell_agents(self, alert: Mapping[str, Any]) -> None:
        """A firing warning or critical alert to its run's agents connected here (on every
        replica, through the broker: the agent may be connected to any). Unsilenced only;
        the agent logs each alert once per severity, so updates repeat nothing."""
        listeners = self._agents.get(str(alert.get("run_id")))
        if not listeners or alert.get("state") != "firing":
            return
        if alert.get("severity") not in ("warning", "critical"):
            return
        silenced = alert.get("silenced_until")
        if isinstance(silenced, (int, float)) and silenced > time.time():
            return
        told = {name: alert.get(name) for name in _AGENT_ALERT_FIELDS}
        message = json.dumps({"type": ALERT, "v": PROTOCOL_VERSION, "alert": told})
        for subscriber in listeners:
            subscriber.offer(message)

    def _offer_alert(self, message: str, project: str | None) -> None:
        """``message`` to every browser that sees ``project`` (alerts, deletions)."""
        for subscriber in self._subscribers:
            if subscriber.project in (None, project):
                subscriber.offer(message)

    def points(self, run_id: str, points: Mapping[str, SeqColumns]) -> None:
        """Push new points of ``run_id`` to the browsers that watch it."""
        if self._broker is None and run_id not in self._watched:
            return
        if self._broker is not None and not self._broker.heard(POINTS + run_id):
            return
        message = points_message(run_id, points)
        if self._broker is not None:
            self._broker.publish(POINTS + run_id, message)
        else:
            self._offer_points(run_id, message)

    def _offer_points(self, run_id: str, message: str) -> None:
        if run_id not in self._watched:
            return
        plain: str | None = None  # for browsers that did not ask for clocks: made once
        for subscriber in self._subscribers:
            if run_id not in subscriber.runs:
                continue
            if subscriber.clocks:
                subscriber.offer(message)
                continue
            if plain is None:
                plain = without_clocks(message)
            subscriber.offer(plain)

    async def _push_runs_forever(self) -> None:
        """Pushes what changed: the first change after a quiet spell at once, later ones
        together, one push an interval at most; asleep while nothing changes (an idle server
        is not woken for it)."""
        loop = asyncio.get_running_loop()
        pushed = -math.inf
        while True:
            await self._due.wait()
            wait = pushed + self._interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._due.clear()
            pushed = loop.time()
            self.flush_runs()

    def flush_runs(self) -> None:
        if not self._dirty_runs and not self._dirty_health:
            return
        changed: dict[str, dict[str, Any]] = {k: dict(v) for k, v in self._dirty_runs.items()}
        for run_id, (project, health) in self._dirty_health.items():
            changed.setdefault(run_id, {"id": run_id, "project": project})["health"] = health
        runs = list(changed.values())
        self._dirty_runs, self._dirty_health = {}, {}
        if self._broker is not None:
            self._broker.publish(RUNS, json.dumps(runs))
        else:
            self._offer_runs(runs)

    def received(self, channel: str, message: str) -> None:
        """A message from the broker (published by any replica, this one included)."""
        if channel.startswith(POINTS):
            self._offer_points(channel[len(POINTS) :], message)
        elif channel == ALERTS:
            alert = json.loads(message)["alert"]
            self._offer_alert(message, alert.get("project"))
            self._tell_agents(alert)
        elif channel == RUNS:
            self._offer_runs(json.loads(message))
        elif channel == INTERRUPTED:
            for subscriber in self._subscribers:
                subscriber.interrupted = True
                subscriber.overflowed.set()
        elif channel == REVOKED:
            if self._on_revoked is not None:
                self._on_revoked(message)
        elif channel == DELETED:
            deleted = json.loads(message)
            self._dirty_runs.pop(deleted["run_id"], None)
            self._dirty_health.pop(deleted["run_id"], None)
            self._offer_alert(message, deleted["project"])

    def _offer_runs(self, runs: list[dict[str, Any]]) -> None:
        messages: dict[str | None, str | None] = {}  # one message per project seen
        for subscriber in self._subscribers:
            project = subscriber.project
            if project not in messages:
                shown = runs if project is None else [r for r in runs if r["project"] == project]
                messages[project] = json.dumps({"type": "runs", "runs": shown}) if shown else None
            message = messages[project]
            if message is not None:
                subscriber.offer(message)


def finite_or_none(values: Iterable[float]) -> list[float | None]:
    """Values as JSON to browsers and API clients carry them (docs/protocol.md, "NaN and
    ±Inf"): NaN and ±Infinity as null, which plotly draws as a gap (JSON has neither)."""
    listed = list(values)
    if math.isfinite(sum(listed)):  # the common case: one C loop (an overflow only costs)
        return cast("list[float | None]", listed)
    return [v if math.isfinite(v) else None for v in listed]


class LiveClock(TypedDict):
    step: list[int]
    time: list[float]


class LiveSeries(TypedDict, total=False):
    """One series of a live ``points`` message: on a shared ``clock`` (its key in
    ``clocks``), or with its own ``step`` and ``time``."""

    clock: str
    step: list[int]
    time: list[float]
    value: list[float | None]


class LivePoints(TypedDict):
    type: Literal["points"]
    run_id: str
    clocks: NotRequired[dict[str, LiveClock]]
    series: dict[str, LiveSeries]


def points_message(run_id: str, points: Mapping[str, SeqColumns]) -> str:
    """The live push of a frame's points, in the layout of the agent's ``points`` frame: a
    clock two or more series are on goes once in ``clocks`` and they name it; a series on
    a clock of its own carries its ``step`` and ``time``. Values as :func:`finite_or_none`.

    orjson: about twenty times as fast as ``json.dumps`` on a second of a small model's
    points (``benchmarks/encode.py``)."""
    frame = ClockedSeries.of(points)
    sharing = frame.sharing()
    clocks: dict[str, LiveClock] = {}
    series: dict[str, LiveSeries] = {}
    for name, (index, values) in frame.series.items():
        steps, times = frame.clocks[index]
        if sharing[index] < 2:
            series[name] = {"step": list(steps), "time": list(times),
                            "value": finite_or_none(values)}  # fmt: skip
            continue
        key = str(index)
        if key not in clocks:
            clocks[key] = {"step": list(steps), "time": list(times)}
        series[name] = {"clock": key, "value": finite_or_none(values)}
    message: LivePoints = {"type": "points", "run_id": run_id, "series": series}
    if clocks:
        message["clocks"] = clocks
    return orjson.dumps(message).decode()


def without_clocks(message: str) -> str:
    """A live ``points`` message with each series' steps and times in the series again: the
    form of a browser that did not ask for clocks (``docs/protocol.md``)."""
    if '"clocks"' not in message:
        return message
    decoded = orjson.loads(message)
    clocks = decoded.pop("clocks", None)
    if not isinstance(clocks, dict):
        return message
    for name, column in decoded["series"].items():
        if "clock" in column:
            clock = clocks[column["clock"]]
            decoded["series"][name] = {"step": clock["step"], "time": clock["time"],
                                       "value": column["value"]}  # fmt: skip
    return orjson.dumps(decoded).decode()
