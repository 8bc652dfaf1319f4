"""The hand-off between the training thread (which records) and the sender thread (which sends)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, KeysView, Mapping, Sequence
from typing import NotRequired, Required, TypeAlias, TypedDict

import orjson

from trainvitals.protocol import (
    MAX_POINTS_PER_FRAME,
    POINTS,
    PROTOCOL_VERSION,
    ClockedSeries,
    SeqColumns,
)
from trainvitals.protocol import Clock as ProtocolClock


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


class PointsFrame(TypedDict):
    """A ``points`` frame as the agent packs it: its series, and the clocks they name if any."""

    type: str
    v: int
    seq: int
    series: dict[str, PointsColumn]
    clocks: NotRequired[dict[str, Clock]]


class PointBuffer:
    """Points recorded by the training thread, waiting for the sender thread.

    Points are kept by clock, as the frame with clocks carries them: series recorded at the
    same steps and times hold those once, so the sender writes the frame without looking for
    which series share. ``add`` records one step's values (one clock); ``add_columns`` records
    many steps of many series at once (what ``VitalsCallback`` does every few dozen steps),
    series handed over with the very same steps and times lists on one clock.
    """

    def __init__(self, on_step: Callable[[int, float | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        #: Each series' clock, in the order the series first came.
        self._on: dict[str, _Held] = {}
        self._clocks: list[_Held] = []
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
            if values:
                held = self._clock_of(values.keys())
                if held is not None:
                    held.steps.append(step)
                    held.times.append(time)
                    for name, value in values.items():
                        held.values[name].append(value)
                else:
                    self._regroup([step], [time], {name: [v] for name, v in values.items()})
                self._count += len(values)
            self._advance(step)

    def add_columns(
        self, columns: Mapping[str, SeqColumns], clock: Sequence[tuple[int, float]] = ()
    ) -> None:
        """Record whole columns: ``{name: (steps, times, values)}``, each in step order.
        Series given the same steps and times objects (as ``packing.decode`` gives them), or on
        one clock of a :class:`~trainvitals.protocol.ClockedSeries`, keep them once.

        ``clock`` says when each step ended, as ``(step, time.monotonic())`` in step order, so
        that the hang detector learns the real step intervals, not the bulk's."""
        with self._lock:
            for step, at in clock:
                self._advance(step, at)
            last = self.last_step
            for steps, times, values in _by_clock(columns):
                if not steps:
                    continue
                held = self._clock_of(values.keys())
                if held is not None:
                    held.steps.extend(steps)
                    held.times.extend(times)
                    for name, column in values.items():
                        held.values[name].extend(column)
                else:
                    self._regroup(steps, times, values)
                self._count += len(steps) * len(values)
                last = max(last, steps[-1])
            self._advance(last)

    def _clock_of(self, names: KeysView[str]) -> _Held | None:
        """The clock that holds just the series ``names`` (not none of them), if one does."""
        held = self._on.get(next(iter(names)))
        return held if held is not None and held.values.keys() == names else None

    def _regroup(
        self, steps: Sequence[int], times: Sequence[float], values: Mapping[str, Sequence[float]]
    ) -> None:
        """Record series that share ``steps`` and ``times`` but are not held on one clock of
        their own: the new ones go on a new clock together; those held on a clock with series
        that are not here (a metric that comes and goes) go on a clock apart, a copy of the
        steps and times they had."""
        held_on: dict[int, tuple[_Held, list[str]]] = {}
        new: list[str] = []
        for name in values:
            held = self._on.get(name)
            if held is None:
                new.append(name)
            else:
                held_on.setdefault(id(held), (held, []))[1].append(name)
        for held, names in held_on.values():
            if len(names) < len(held.values):
                moved = {name: held.values.pop(name) for name in names}
                held = _Held(list(held.steps), list(held.times), moved)
                self._clocks.append(held)
                self._on.update(dict.fromkeys(names, held))
            held.steps.extend(steps)
            held.times.extend(times)
            for name in names:
                held.values[name].extend(values[name])
        if new:
            fresh = _Held(list(steps), list(times), {name: list(values[name]) for name in new})
            self._clocks.append(fresh)
            self._on.update(dict.fromkeys(new, fresh))

    def _advance(self, step: int, at: float | None = None) -> None:
        if step > self.last_step:
            if self._on_step is not None:
                self._on_step(step - self.last_step, at)
            self.last_step = step

    def drain(self) -> ClockedSeries[list[int], list[float]]:
        """Everything held, each clock once, and forget it."""
        with self._lock:
            on, clocks = self._on, self._clocks
            self._on, self._clocks, self._count = {}, [], 0
            self.urgent = False
        index = {id(held): i for i, held in enumerate(clocks)}
        return ClockedSeries(
            [ProtocolClock(held.steps, held.times) for held in clocks],
            {name: (index[id(held)], held.values[name]) for name, held in on.items()},
        )

    def __len__(self) -> int:
        return self._count


class _Held:
    """One clock's points waiting to be sent: its steps and times, each series' values."""

    __slots__ = ("steps", "times", "values")

    def __init__(self, steps: list[int], times: list[float], values: dict[str, list[float]]):
        self.steps = steps
        self.times = times
        self.values = values


#: Series on one clock: its steps, its times, and each series' values.
_OnClock: TypeAlias = tuple[Sequence[int], Sequence[float], dict[str, Sequence[float]]]


def _by_clock(series: Mapping[str, SeqColumns]) -> list[_OnClock]:
    """``series`` grouped by clock: a :class:`ClockedSeries`'s clocks, else series that hold
    the very same steps and times objects (not merely equal numbers: no search)."""
    if isinstance(series, ClockedSeries):
        grouped: dict[int, _OnClock] = {}
        for name, (index, values) in series.series.items():
            at = grouped.get(index)
            if at is None:
                steps, times = series.clocks[index]
                at = grouped[index] = (steps, times, {})
            at[2][name] = values
        return list(grouped.values())
    by_identity: dict[tuple[int, int], _OnClock] = {}
    at = None
    for name, (steps, times, values) in series.items():
        # The series of a clock mostly come one after another (``packing.decode``'s do).
        if at is None or steps is not at[0] or times is not at[1]:
            key = (id(steps), id(times))
            at = by_identity.get(key)
            if at is None:
                at = by_identity[key] = (steps, times, {})
        at[2][name] = values
    return list(by_identity.values())


def points_frames(
    series: Mapping[str, SeqColumns], first_seq: int, clocks: bool = False
) -> list[PointsFrame]:
    """Pack drained series into ``points`` frames of MAX_POINTS_PER_FRAME points at most.

    With ``clocks`` (for a server that reads them), the series of a clock that two or more
    share (a :class:`ClockedSeries`'s, as :meth:`PointBuffer.drain` gives them, or those that
    hold the very same steps and times lists) name it in the frame's ``clocks`` instead of each
    sending its steps and times; without, each series carries them, as every server reads. A
    clock's series are split across frames at the same steps, so they share it in each."""
    frames: list[PointsFrame] = []
    current: dict[str, PointsColumn] = {}
    shared: dict[str, Clock] = {}
    room = MAX_POINTS_PER_FRAME
    for steps, times, values in _fitting(_by_clock(series)):
        width = len(values)
        start = 0
        while start < len(steps):
            if room < width:
                frames.append(_frame(current, shared, first_seq + len(frames)))
                current, shared, room = {}, {}, MAX_POINTS_PER_FRAME
            end = min(len(steps), start + room // width)
            whole = start == 0 and end == len(steps)
            at_steps = steps if whole else steps[start:end]
            at_times = times if whole else times[start:end]
            if clocks and width > 1:
                key = str(len(shared))
                shared[key] = {"step": at_steps, "time": at_times}
                for name, column in values.items():
                    current[name] = {"clock": key, "value": column if whole else column[start:end]}
            else:
                for name, column in values.items():
                    current[name] = {
                        "step": at_steps,
                        "time": at_times,
                        "value": column if whole else column[start:end],
                    }
            room -= (end - start) * width
            start = end
    if current:
        frames.append(_frame(current, shared, first_seq + len(frames)))
    return frames


def _fitting(on_clocks: list[_OnClock]) -> list[_OnClock]:
    """``on_clocks`` with a clock of more series than a frame holds points (a step of each
    could not go in one frame) as a clock a series."""
    if all(len(values) <= MAX_POINTS_PER_FRAME for _, _, values in on_clocks):
        return on_clocks
    fitting: list[_OnClock] = []
    for steps, times, values in on_clocks:
        if len(values) <= MAX_POINTS_PER_FRAME:
            fitting.append((steps, times, values))
        else:
            fitting += [(steps, times, {name: column}) for name, column in values.items()]
    return fitting


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


def _frame(series: dict[str, PointsColumn], clocks: dict[str, Clock], seq: int) -> PointsFrame:
    frame: PointsFrame = {"type": POINTS, "v": PROTOCOL_VERSION, "seq": seq, "series": series}
    if clocks:
        frame["clocks"] = clocks
    return frame
