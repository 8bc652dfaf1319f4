"""One recorder for both front-ends: a device ring's rows, into a run.

``VitalsCallback`` and ``Monitor`` learn of a step differently (Keras's hooks; ``log``
calls), but what becomes of the rows the step writes into the device ring
(:mod:`trainvitals.agent.ring`) is the same: a look reads them and keeps them on the host
(:meth:`Recorder.stage`), they wait for the next frame unless they hold something urgent
(:meth:`Recorder.look`), a hand-over turns them into columns (:meth:`Recorder.hand_over`),
and recording them (:meth:`Recorder.record`) checks the weights for NaN/Inf now and then and
gives the first NaN/Inf step its autopsy. What each front-end tells the recorder is its
:class:`Timeline` (which step and time each row is) and the :class:`Evidence` an autopsy can
replay.

No TensorFlow is imported here: ``Monitor`` loads it at its first ``log``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from trainvitals.agent import packing
from trainvitals.agent.run import Run
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import ListColumns
from trainvitals.series import NONFINITE_WEIGHTS

if TYPE_CHECKING:
    from trainvitals.agent.bad_step import Kept
    from trainvitals.agent.protect import Guard
    from trainvitals.agent.ring import DeviceRing
    from trainvitals.agent.tf_vitals import WeightsCheck

__all__ = ["Evidence", "Placed", "Recorder", "Timeline"]

log = logging.getLogger("trainvitals")

#: Rows as the ring keeps them: one packed vector a row, float64.
Block = npt.NDArray[np.float64]


class Placed(NamedTuple):
    """Rows of the ring placed in the run: their steps and unix times, and any columns the
    front-end measured beside them (the callback's step times)."""

    steps: list[int]
    times: list[float]
    columns: dict[str, ListColumns]


class Timeline(Protocol):
    """What a front-end knows of its steps that the ring's rows do not say."""

    def keep(self, ring: DeviceRing, upto: int | None, run: Run) -> Block:
        """Read the ring (:meth:`DeviceRing.keep`), noting for the run what the read
        covers; returns every row kept since the last take."""
        ...

    def place(self, numbers: npt.NDArray[np.int64]) -> Placed:
        """The rows with these write numbers, as steps and times."""
        ...

    def reached(self) -> int:
        """The step training has reached by now, where the front-end can tell (else 0)."""
        ...


@dataclass(frozen=True, slots=True)
class Evidence:
    """What an autopsy of a NaN/Inf step can replay (see
    :func:`trainvitals.agent.autopsy.of_step`): the batch, or the batch and weights ``fit``'s
    step kept; whether the weights were poisoned before training; whether the model's
    weights may already hold the step's update."""

    inputs: Any = None
    targets: Any = None
    kept: Kept | None = None
    poisoned_at_start: bool = False
    after_update: bool = False


class Recorder:
    """Reads a device ring's rows into ``run``, for one run of either front-end.

    Args:
        run: where the points go.
        model: the Keras model the autopsy replays (None: it works from the vitals).
        vitals: says which rows carry per-variable gradient norms.
        timeline: the front-end's steps and times of the rows.
        evidence: what the autopsy of step ``n`` can replay, asked once, at that step.
        weights: the weights' NaN/Inf check, run at most every ``weights_every`` steps
            (None: none).
        guard: the protective actions of ``VitalsCallback(protect=...)``.

    Not thread-safe: the front-end holds one lock around :meth:`look`, :meth:`stage`,
    :meth:`hand_over` and :meth:`record` (the training thread and the sender's looks both
    call them).

    Example:
        ```python
        recorder = Recorder(run, model, StepVitals(), timeline, lambda step: Evidence())
        run.on_tick(lambda: recorder.look(ring, measured))  # five looks a second
        ```
    """

    def __init__(
        self,
        run: Run,
        model: Any,
        vitals: StepVitals,
        timeline: Timeline,
        evidence: Callable[[int], Evidence],
        weights: WeightsCheck | None = None,
        weights_every: int = 0,
        guard: Guard | None = None,
    ) -> None:
        self.run = run
        self.weights = weights
        self.guard = guard
        self._model = model
        self._vitals = vitals
        self._timeline = timeline
        self._evidence = evidence
        self._weights_every = weights_every
        #: The per-variable gradient norms of the last healthy step that had them.
        self._healthy_norms: dict[str, float] = {}
        self._autopsied = False
        self._autopsy_lock = threading.Lock()

    def look(self, ring: DeviceRing, measured: packing.Measured) -> bool:
        """The sender's look, every ``read_interval``: read the ring, and hand what it has read
        to the run only when a frame leaves at this look anyway, or when the rows held since
        the last hand-over hold something urgent (:mod:`~trainvitals.agent.urgency`); returns
        whether it did. Otherwise the rows wait for the next send: turning them into points
        costs the sender about 0.4 ms a look inside a fit whatever their number, so one
        hand-over a frame pays it once, not at each of five looks."""
        block = self.stage(ring)
        # With protect=, every look confirms healthy steps, so that the weights' copies
        # taken before them can go (one every `good_every` steps would pile up for a second).
        due = self.guard is not None or self.run.rows_due(packing.head_series(block, measured))
        if due:
            self.hand_over(ring, measured)
        return due

    def stage(self, ring: DeviceRing, upto: int | None = None) -> Block:
        """One fetch of the ring: its fresh rows (none numbered after ``upto``) are kept for
        the next hand-over, and every row kept since the last one is returned (a rise held
        for three steps may begin in an earlier look's rows)."""
        lost = ring.lost
        block = self._timeline.keep(ring, upto, self.run)
        if ring.lost > lost:
            log.warning("trainvitals: %d steps' vitals overwritten before a read", ring.lost - lost)
        return block

    def hand_over(self, ring: DeviceRing, measured: packing.Measured) -> None:
        """The rows the looks kept become points, then are recorded (:meth:`record`)."""
        numbers, block = ring.take()
        placed = self._timeline.place(numbers)
        if not len(numbers) and not placed.columns:
            return
        decoded = packing.decode(block, placed.steps, placed.times, measured, self._vitals)
        columns = decoded.columns
        columns.update(placed.columns)
        sick_rows = set(decoded.sick)
        steps = placed.steps
        sick = [steps[j] for j in decoded.sick]
        healthy = [step for j, step in enumerate(steps) if j not in sick_rows]
        self.record(packing.Pivot(columns, [], steps, healthy, sick, decoded.healthy_norms))

    def record(self, batch: packing.Pivot) -> None:
        """Hand collected steps to the run, check the weights if due, and act on the first
        NaN/Inf step."""
        run = self.run
        if batch.healthy_norms is not None:
            self._healthy_norms = batch.healthy_norms
        run.add_columns(batch.columns, batch.clock)
        self._check_weights(batch.steps)
        for step in batch.sick:
            self._autopsy(step, packing.values_at(batch.columns, step))
        if self.guard is not None and batch.healthy:
            first_sick = batch.sick[0] if batch.sick else None
            healthy = [s for s in batch.healthy if first_sick is None or s < first_sick]
            if healthy:
                self.guard.healthy_upto(healthy[-1])

    def _check_weights(self, steps: list[int]) -> None:
        check = self.weights
        if check is None or not self._weights_every:
            return
        checks = [s for s in steps if s % self._weights_every == 0]
        if checks and check.due():
            count = check()
            # Filed under the step the weights were read at, where the front-end knows it
            # (training goes on while the sender reads them), not the earlier one that made
            # the check due: a NaN that came in between would seem to come before the step
            # that made it.
            at = max(checks[-1], self._timeline.reached())
            self.run.log(at, {NONFINITE_WEIGHTS: count})

    def _autopsy(self, step: int, values: dict[str, float]) -> None:
        """The autopsy of the first NaN/Inf step, and the protective actions."""
        with self._autopsy_lock:
            if self._autopsied:
                return
            self._autopsied = True
        from trainvitals.agent import autopsy  # TensorFlow: loaded by now, at a NaN

        evidence = self._evidence(step)
        report = autopsy.of_step(
            self._model,
            values,
            self._healthy_norms,
            evidence.inputs,
            evidence.targets,
            kept=evidence.kept,
            poisoned_at_start=evidence.poisoned_at_start,
            after_update=evidence.after_update,
        )
        if self.guard is not None:
            action = self.guard.nonfinite_step(step)
            if action is not None:
                report["action"] = action
        log.warning("trainvitals: NaN/Inf at step %d: %s", step, report.get("verdict", report))
        self.run.report_autopsy(step, report)
