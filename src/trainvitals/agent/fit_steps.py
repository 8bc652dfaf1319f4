"""The steps of one ``fit`` as Keras's hooks see them: ``VitalsCallback``'s timeline.

Keras numbers batches within an epoch and calls the batch hooks once an execution
(``steps_per_execution`` steps); the tapped train step numbers its rows of the device ring by
step. :class:`FitSteps` turns the hooks' batch numbers into the run's steps, notes when each
execution ended and how long a step took, and from those times the rows a read brings
(the :class:`~trainvitals.agent.recorder.Timeline` of the callback's recorder).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from trainvitals.agent import packing
from trainvitals.agent.packing import StepTime
from trainvitals.agent.recorder import Block, Placed
from trainvitals.series import STEP_TIME

if TYPE_CHECKING:
    from trainvitals.agent.ring import DeviceRing
    from trainvitals.agent.run import Run

__all__ = ["FitSteps", "to_unix"]


class Tapped(Protocol):
    """Where the tapped train step writes its rows: a ``TrainStepTap``."""

    ring: DeviceRing | None


class FitSteps:
    """One fit's step numbers, execution ends and step times.

    The training thread calls :meth:`epoch_began`, :meth:`batch_began` and :meth:`ended`
    (list appends, no lock); the recorder's reads take what they noted.

    Args:
        tap: the fit's tap; its ring's count of rows is the step training has reached.
        epoch_steps: the steps of an epoch, as Keras knows them when fit begins (0: it
            does not).
    """

    def __init__(self, tap: Tapped, epoch_steps: int = 0) -> None:
        self._tap = tap
        self._epoch_steps = epoch_steps
        self._epoch_first = 0
        #: The latest step whose end a hook has seen.
        self.last = 0
        self._began: tuple[int, float] | None = None
        # (step, time.monotonic()) at each execution's end, and the step times measured
        # between executions' starts, appended by the training thread.
        self._ends: list[tuple[int, float]] = []
        self._step_times: list[StepTime] = []
        self._taking = threading.Lock()  # the takers' (the appender goes without)
        # What the reads noted since the last hand-over (their rows wait in the ring:
        # DeviceRing.keep), and the last execution end a hand-over used.
        self._staged_clock: list[tuple[int, float]] = []
        self._staged_step_times: list[StepTime] = []
        self._last_end: tuple[int, float] = (0, time.monotonic())
        self._placed_until = -math.inf  # the time of the last row placed (time.monotonic())

    def epoch_began(self) -> None:
        self._epoch_first = self.last
        self._began = None  # validation time is not step time

    def batch_began(self, batch: int) -> None:
        """Keras calls its hook on the training thread, in order, right before each
        execution, so the time between two of them is the step time as training
        experiences it: filed under the last step of the previous execution."""
        now = time.perf_counter()
        began = self._began
        self._began = (batch, now)
        if began is not None and batch > began[0]:
            step = self._epoch_first + batch
            self._step_times.append((step, (now - began[1]) / (batch - began[0]), time.time()))

    def step_of(self, batch: int) -> int:
        """The run's step of the execution Keras numbers ``batch`` (which restarts each
        epoch). Keras numbers an execution by its last step as if it were whole: the last of
        an epoch that ``steps_per_execution`` does not divide ends past the epoch's last
        batch."""
        if self._epoch_steps:
            batch = min(batch, self._epoch_steps - 1)
        return self._epoch_first + batch + 1

    def ended(self, step: int, now: float) -> None:
        """The execution ending at ``step`` ended at ``now`` (``time.monotonic()``)."""
        self.last = step
        self._ends.append((step, now))

    def epoch_read(self, read_upto: int) -> None:
        """Every row of the epoch has been read, up to ``read_upto``: the count the next
        epoch's steps follow, where Keras did not know the epoch's length to number its last
        execution."""
        self.last = min(self.last, read_upto)

    def take_step_times(self) -> list[StepTime]:
        with self._taking:
            step_times = self._step_times
            taken = step_times[: len(step_times)]
            del step_times[: len(taken)]
        return taken

    def keep(self, ring: DeviceRing, upto: int | None, run: Run) -> Block:
        """Read the ring (:meth:`DeviceRing.keep`); the execution ends noted since the last
        read go to the run's hang detector now, and wait with the step times for the rows'
        hand-over."""
        # The execution ends and step times are taken before the read: each is then of an
        # execution whose rows the read sees, so none lies past the rows but where Keras
        # numbered an execution past the data (the last of an epoch that steps_per_execution
        # does not divide, numbered as a whole one; with data of unknown length, the one more
        # that began and found no batch): those are filed under the last step there was.
        ends = self._ends
        clock = ends[: len(ends)]
        del ends[: len(clock)]
        step_times = self.take_step_times()
        block = ring.keep(upto)
        top = ring.read_upto
        if clock and clock[-1][0] > top:  # in step order: only the last few can lie past
            clock = [(min(step, top), at) for step, at in clock]
        if step_times and step_times[-1][0] > top:
            step_times = [(min(step, top), took, at) for step, took, at in step_times]
        self._staged_step_times.extend(step_times)
        if clock:
            self._staged_clock.extend(clock)
            run.add_columns({}, clock)
        return block

    def place(self, numbers: npt.NDArray[np.int64]) -> Placed:
        """The rows' steps (their write numbers) and times: each step's time is when its
        execution ended, interpolated between executions of several steps; a step whose end
        no hook has noted yet is timed now. The step times noted since the last hand-over
        come with them."""
        clock, self._staged_clock = self._staged_clock, []
        steps = numbers.tolist()
        times: list[float] = []
        if steps:
            known = [self._last_end, *clock]
            if steps[-1] > known[-1][0]:
                known.append((steps[-1], time.monotonic()))
            at = np.interp(numbers, [k[0] for k in known], [k[1] for k in known])
            # A row timed at a read that ran long is later than the ends noted meanwhile for
            # the rows after it: those are timed no earlier, so that times keep step order.
            at = np.maximum.accumulate(np.concatenate([[self._placed_until], at]))[1:]
            self._placed_until = float(at[-1])
            times = packing.micros(at + to_unix())
        if clock:
            self._last_end = clock[-1]
        step_times, self._staged_step_times = self._staged_step_times, []
        columns = {STEP_TIME: packing.step_time_columns(step_times)} if step_times else {}
        return Placed(steps, times, columns)

    def reached(self) -> int:
        """The ring's count of rows: the step the train step has reached."""
        ring = self._tap.ring
        return ring.written() if ring is not None else 0


def to_unix() -> float:
    """What turns a ``time.monotonic()`` into a unix time, now."""
    return time.time() - time.monotonic()
