"""The hand-off between the training thread (which records) and the sender thread (which sends)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import NotRequired, Required, TypedDict

import orjson

from trainvitals.protocol import (
    MAX_POINTS_PER_FRAME,
    POINTS,
    PROTOCOL_VERSION,
    Columns,
    ListColumns,
    SeqColumns,
)


class PointsColumn(TypedDict, total=False):
    """One series of a ``points`` frame: its values, with its steps and times or with the
    name of the frame's clock that holds them (``docs/protocol.md``)."""

    step: Sequence[int]
    time: Sequence[float]
    clock: str
    value: Required[Sequence[float]]


class Clock(TypedDict):
    """Steps and times that several series of a frame share."""

    step: Sequence[int]
    time: Sequence[float]


class PointsBody(TypedDict):
    """A ``points`` frame's series, and the clocks they name if any."""

    series: dict[str, PointsColumn]
    clocks: NotRequired[dict[str, Clock]]


class PointsFrame(PointsBody):
    """A ``points`` frame as the agent packs it."""

    type: str
    v: int
    seq: int


class PointBuffer:
    """Points recorded by the training thread, waiting for the sender thread.

    Points are kept in the wire's own layout (per series: steps, times, values), so the sender
    has nothing to regroup. ``add`` records one step's values; ``add_columns`` records many
    steps of many series at once (what ``VitalsCallback`` does every few dozen steps).
    """

    def __init__(self, on_step: Callable[[int, float | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._series: dict[str, ListColumns] = {}
        self._count = 0
        self._on_step = on_step
        #: The highest training step recorded so far; per-second readings are filed under it.
        self.last_step = 0
        #: Whether what is held must be sent now rather than at the next send
        #: (:mod:`trainvitals.agent.urgency`); cleared by :meth:`drain`.
        self.urgent = False

    def hurry(self) -> None:
        """Mark what is held as urgent: the sender sends it at its next look."""
        self.urgent = True

    def add(self, step: int, time: float, values: Mapping[str, float]) -> None:
        with self._lock:
            series = self._series
            for name, value in values.items():
                columns = series.get(name)
                if columns is None:
                    columns = series[name] = Columns([], [], [])
                columns[0].append(step)
                columns[1].append(time)
                columns[2].append(value)
            self._count += len(values)
            self._advance(step)

    def add_columns(
        self, columns: Mapping[str, SeqColumns], clock: Sequence[tuple[int, float]] = ()
    ) -> None:
        """Record whole columns: ``{name: (steps, times, values)}``, each in step order.

        ``clock`` says when each step ended, as ``(step, time.monotonic())`` in step order, so
        that the hang detector learns the real step intervals, not the bulk's."""
        with self._lock:
            series = self._series
            for step, at in clock:
                self._advance(step, at)
            last = self.last_step
            for name, (steps, times, values) in columns.items():
                if not steps:
                    continue
                held = series.get(name)
                if held is None:
                    series[name] = Columns(list(steps), list(times), list(values))
                else:
                    held[0].extend(steps)
                    held[1].extend(times)
                    held[2].extend(values)
                self._count += len(steps)
                last = max(last, steps[-1])
            self._advance(last)

    def _advance(self, step: int, at: float | None = None) -> None:
        if step > self.last_step:
            if self._on_step is not None:
                self._on_step(step - self.last_step, at)
            self.last_step = step

    def drain(self) -> dict[str, ListColumns]:
        with self._lock:
            series, self._series, self._count = self._series, {}, 0
            self.urgent = False
        return series

    def __len__(self) -> int:
        return self._count


def points_frames(
    series: Mapping[str, SeqColumns], first_seq: int, clocks: bool = False
) -> list[PointsFrame]:
    """Pack drained series into ``points`` frames of MAX_POINTS_PER_FRAME points at most;
    with ``clocks`` (for a server that reads them), series of a frame that share their steps
    and times send them once (:func:`share_clocks`)."""
    frames: list[PointsFrame] = []
    current: dict[str, PointsColumn] = {}
    room = MAX_POINTS_PER_FRAME
    for name, (steps, times, values) in series.items():
        start = 0
        while start < len(steps):
            if room == 0:
                frames.append(_frame(current, first_seq + len(frames), clocks))
                current, room = {}, MAX_POINTS_PER_FRAME
            end = min(len(steps), start + room)
            whole = start == 0 and end == len(steps)
            current[name] = {
                "step": steps if whole else steps[start:end],
                "time": times if whole else times[start:end],
                "value": values if whole else values[start:end],
            }
            room -= end - start
            start = end
    if current:
        frames.append(_frame(current, first_seq + len(frames), clocks))
    return frames


def share_clocks(series: dict[str, PointsColumn]) -> PointsBody:
    """The ``series`` (and ``clocks``) of a frame in which series with equal steps and times
    name one clock that holds them, instead of each sending them (``FEATURE_CLOCKS``).

    A fit's vitals and its Keras metrics are recorded at the same steps and times, and so
    are its per-variable gradient norms at theirs: in a second of a small model's points those
    steps and times, sent once a series, were about half of the frame's text. Series of one
    point (a system sample) and steps and times no other series shares (the step time's,
    stamped as the next step begins) stay as they are."""
    held: list[tuple[Sequence[int], Sequence[float], list[str]]] = []
    for name, column in series.items():
        steps, times = column["step"], column["time"]
        if len(steps) < 2:
            continue
        for same_steps, same_times, names in held:
            if same_steps == steps and same_times == times:
                names.append(name)
                break
        else:
            held.append((steps, times, [name]))
    shared = [clock for clock in held if len(clock[2]) > 1]
    if not shared:
        return {"series": series}
    out = dict(series)
    clocks: dict[str, Clock] = {}
    for index, (steps, times, names) in enumerate(shared):
        key = str(index)
        clocks[key] = {"step": steps, "time": times}
        for name in names:
            out[name] = {"clock": key, "value": series[name]["value"]}
    return {"series": out, "clocks": clocks}


def without_clocks(text: str) -> str:
    """A ``points`` frame's text with each series' steps and times in the series again, for
    a server that does not read clocks (one of an older version, after a reconnect); any
    other frame's text unchanged."""
    if '"clocks"' not in text:
        return text
    frame = json.loads(text)
    clocks = frame.pop("clocks", None) if frame.get("type") == POINTS else None
    if not isinstance(clocks, dict):
        return text
    for name, column in frame["series"].items():
        clock = clocks.get(column.get("clock")) if isinstance(column, dict) else None
        if clock is not None:
            frame["series"][name] = {"step": clock["step"], "time": clock["time"],
                                     "value": column["value"]}  # fmt: skip
    return encode_points(frame)


def encode_points(frame: PointsFrame) -> str:
    """A ``points`` frame of :func:`points_frames` as JSON text.

    orjson writes it about twenty times as fast as the standard library (a second of a 2 ms
    step's points: 0.17 ms against 4.0 ms, the largest part of the sender's work), but writes
    NaN and ±Infinity as ``null``. They are data here, sent as the JSON tokens ``NaN`` and
    ``Infinity`` that the server reads as such, so a frame holding one (or anything else
    orjson does not write the same way) goes through the standard library's encoder."""
    try:
        # A NaN or an Inf makes a sum non-finite (a finite sum that overflows only costs the
        # slower encoder). Times need no look: the server refuses a non-finite one either way.
        if all(math.isfinite(sum(column["value"])) for column in frame["series"].values()):
            return orjson.dumps(frame).decode()
    except (TypeError, OverflowError, orjson.JSONEncodeError):
        pass  # a value that is not a plain number: the standard encoder says what it makes of it
    return json.dumps(frame)


def _frame(series: dict[str, PointsColumn], seq: int, clocks: bool) -> PointsFrame:
    body = share_clocks(series) if clocks else {"series": series}
    return {"type": POINTS, "v": PROTOCOL_VERSION, "seq": seq, **body}
