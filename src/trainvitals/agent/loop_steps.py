"""A custom loop's steps as ``Monitor.log`` notes them: ``Monitor``'s timeline, and the
latest batches its NaN autopsy may replay.

A loop numbers its steps itself, and ``log`` writes a row into the device ring only when it is
given tensors: the ring's write numbers (1, 2, ...) are not steps. :class:`LoggedSteps` notes
the step and time of each write, for the recorder (:mod:`trainvitals.agent.recorder`) to place
the rows a read brings.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from trainvitals.agent.recorder import Block, Evidence, Placed
from trainvitals.protocol import whole_micros

if TYPE_CHECKING:
    from trainvitals.agent.ring import DeviceRing
    from trainvitals.agent.run import Run

__all__ = ["LoggedSteps", "ReplayBatches"]


class LoggedSteps:
    """The ``(step, unix time)`` of each write into the ring that no read has placed yet."""

    def __init__(self) -> None:
        self._logged: list[tuple[int, float]] = []
        self._base = 0  # the write number before the first one logged
        self._lock = threading.Lock()  # the training thread notes, the readers place

    @property
    def written(self) -> int:
        """The write number of the latest write."""
        return self._base + len(self._logged)

    def restart(self, written: int) -> None:
        """The writes from now on are numbered after ``written`` (another layout's ring)."""
        with self._lock:
            self._logged, self._base = [], written

    def note(self, step: int, at: float) -> None:
        """A write of step ``step`` comes next, at ``at`` (before it: a reader may see its
        row at once)."""
        with self._lock:
            self._logged.append((step, whole_micros(at)))

    def unnote(self) -> None:
        """The write just noted failed."""
        with self._lock:
            self._logged.pop()

    def keep(self, ring: DeviceRing, upto: int | None, run: Run) -> Block:
        """A read of the ring; every step's clock reached the run when it was logged."""
        return ring.keep(upto)

    def place(self, numbers: npt.NDArray[np.int64]) -> Placed:
        if not len(numbers):
            return Placed([], [], {})
        with self._lock:  # every number read was noted before it was written
            logged, base = self._logged, self._base
            rows = [logged[n - 1 - base] for n in numbers.tolist()]
            del logged[: int(numbers[-1]) - base]
            self._base = int(numbers[-1])
        return Placed([row[0] for row in rows], [row[1] for row in rows], {})

    def reached(self) -> int:
        return 0  # the ring counts writes, not the loop's steps


class ReplayBatches:
    """The latest batches ``log`` was given, at most ``limit`` bytes of them (always the
    last one), for the NaN autopsy's replay (0: none kept)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._batches: deque[tuple[int, Any, Any]] = deque()
        self._sizes: deque[int] = deque()
        self._lock = threading.Lock()  # the training thread keeps, the sender's autopsy reads

    def keep(self, step: int, inputs: Any, targets: Any) -> None:
        if self._limit <= 0 or inputs is None:
            return
        size = _nbytes(inputs) + _nbytes(targets)
        with self._lock:
            self._batches.append((step, inputs, targets))
            self._sizes.append(size)
            while len(self._batches) > 1 and sum(self._sizes) > self._limit:
                self._batches.popleft()
                self._sizes.popleft()

    def evidence(self, step: int) -> Evidence:
        """Step ``step``'s batch if it is still held. The loop may have applied that step's
        NaN/Inf since: a replay still finds a layer before the poisoned ones, and else
        leaves the verdict to the vitals."""
        with self._lock:
            held = [(inputs, targets) for s, inputs, targets in self._batches if s == step]
        inputs, targets = held[-1] if held else (None, None)
        return Evidence(inputs=inputs, targets=targets, after_update=True)


def _nbytes(structure: object) -> int:
    """Bytes of the arrays or tensors in a (nested) batch, from their shapes: no copy."""
    total = 0
    stack = [structure]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "shape") and hasattr(item, "dtype"):
            size: Any = getattr(item.dtype, "size", None) or getattr(item.dtype, "itemsize", 4)
            count = 1
            for dim in item.shape:
                count *= int(dim or 0)
            total += count * int(size)
    return total
