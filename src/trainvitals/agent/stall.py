"""Hang detection: no step for far longer than usual while the process lives.

The threshold is ``max(factor x p95 of the recent step intervals, floor)``: a run whose steps
take 50 ms is stalled after a few seconds, one whose steps take a minute only after many
minutes, and nothing is judged before the second step (the first one includes tracing and
compilation, which may take long). :func:`thread_stacks` says where every thread is, so the
report shows where it hangs: an input generator, a collective, a lock.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import deque


class StallDetector:
    """Fed step times by the training thread, asked by another thread whether it hangs.

    Args:
        factor: how many p95 step intervals of silence make a stall (default 10).
        floor: the least silence, in seconds, that counts as a stall (default 30).
    """

    def __init__(self, factor: float = 10.0, floor: float = 30.0) -> None:
        self.factor, self.floor = factor, floor
        self._intervals: deque[float] = deque(maxlen=256)
        self._last_step_at: float | None = None
        self._reported = False

    def step(self, now: float, steps: int = 1) -> None:
        """``steps`` more training steps completed at monotonic time ``now``."""
        if self._last_step_at is not None and steps > 0:
            self._intervals.append((now - self._last_step_at) / steps)
        self._last_step_at = now
        self._reported = False

    def threshold(self) -> float:
        if not self._intervals:
            return float("inf")
        ordered = sorted(self._intervals)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return max(self.factor * p95, self.floor)

    def check(self, now: float) -> tuple[float, float] | None:
        """``(seconds without a step, threshold)`` the first time the silence passes the
        threshold since the last step; None otherwise."""
        if self._last_step_at is None or self._reported:
            return None
        idle, limit = now - self._last_step_at, self.threshold()
        if idle <= limit:
            return None
        self._reported = True
        return idle, limit


def thread_stacks() -> str:
    """Every Python thread's stack, innermost call last, as text."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, '?')!r} ({ident}):\n{stack}")
    return "\n".join(parts)
