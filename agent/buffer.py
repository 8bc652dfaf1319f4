"""The hand-off between the training thread (which records) and the sender thread (which sends)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainvitals.protocol import MAX_POINTS_PER_FRAME, POINTS, PROTOCOL_VERSION

#: (series name, step, unix time, value)
Point = tuple[str, int, float, float]


class PointBuffer:
    """Points recorded by the training thread, waiting for the sender thread.

    ``add`` is the only call on the training path: one lock and a list append per value.
    """

    def __init__(self, on_step: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._points: list[Point] = []
        self._on_step = on_step
        #: The highest training step recorded so far; per-second readings are filed under it.
        self.last_step = 0

    def add(self, step: int, time: float, values: Mapping[str, float]) -> None:
        with self._lock:
            self._points.extend((name, step, time, value) for name, value in values.items())
            if step > self.last_step:
                if self._on_step is not None:
                    self._on_step(step - self.last_step)
                self.last_step = step

    def drain(self) -> list[Point]:
        with self._lock:
            points, self._points = self._points, []
        return points

    def __len__(self) -> int:
        return len(self._points)


def points_frames(points: list[Point], first_seq: int) -> list[dict[str, Any]]:
    """Pack points into ``points`` frames, columnar per series, MAX_POINTS_PER_FRAME at most."""
    frames: list[dict[str, Any]] = []
    for start in range(0, len(points), MAX_POINTS_PER_FRAME):
        frames.append(
            {
                "type": POINTS,
                "v": PROTOCOL_VERSION,
                "seq": first_seq + len(frames),
                "series": _columns(points[start : start + MAX_POINTS_PER_FRAME]),
            }
        )
    return frames


def _columns(points: Iterable[Point]) -> dict[str, dict[str, list[Any]]]:
    series: dict[str, dict[str, list[Any]]] = {}
    for name, step, time, value in points:
        columns = series.get(name)
        if columns is None:
            columns = series[name] = {"step": [], "time": [], "value": []}
        columns["step"].append(step)
        columns["time"].append(time)
        columns["value"].append(value)
    return series
