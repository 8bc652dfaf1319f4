"""Steps that come with Keras's logs: ``VitalsCallback``'s way where there is no device ring.

Under a ``tf.distribute`` strategy with several replicas, or with a train step the tap could
not give a ring, the step's packed vector (if any) and Keras's numbers come with the logs of
the last step of each execution. :class:`LogsFallback` collects them and turns them into
columns a batch of steps at a time, for the recorder to record.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from trainvitals.agent import packing
from trainvitals.agent.fit_steps import FitSteps, to_unix
from trainvitals.agent.packing import Measured, Pivot, Row
from trainvitals.agent.vitals import StepVitals
from trainvitals.series import LOSS

__all__ = ["BATCH_STEPS", "LogsFallback", "numbers_in"]

#: Steps collected from the logs before they become points all at once. A step with a
#: NaN/Inf is handled at once, and no step waits longer than half the read interval.
BATCH_STEPS = 32


class LogsFallback:
    """Steps collected from Keras's logs, waiting to become points.

    Args:
        steps: the fit's steps (the latest one seen is noted there).
        vitals: says which steps carry per-variable gradient norms.
        read_interval: no step waits longer than half of it.
        at_once: hand every step over as it comes (``protect=`` acts at each step).
    """

    def __init__(
        self, steps: FitSteps, vitals: StepVitals, read_interval: float, at_once: bool
    ) -> None:
        self._steps = steps
        self._vitals = vitals
        self._read_interval = read_interval
        self._at_once = at_once
        self._pending: list[Row] = []
        self._pending_since = 0.0
        # Keras may deliver batch ends from a thread pool, several at once and out of order.
        self._lock = threading.Lock()

    def add(
        self,
        step: int,
        now: float,
        packed: object,
        logs: Mapping[str, object] | None,
        measured: Measured,
    ) -> Pivot | None:
        """Note step ``step``, ended at ``now`` (``time.monotonic()``), its packed vector
        (None: the step had none) and its logs; returns the steps collected when they are
        due to become points."""
        vector = None if packed is None else np.asarray(packed)
        numbers = numbers_in(logs)
        numbers.pop(LOSS, None)  # Keras's epoch running mean; "loss" is the batch's own
        with self._lock:
            self._steps.last = max(self._steps.last, step)
            pending = self._pending
            if not pending:
                self._pending_since = now
            pending.append((step, now, vector, numbers))
            if (
                len(pending) < BATCH_STEPS
                and now - self._pending_since < self._read_interval / 2
                and not self._at_once
                and (vector is None or not packing.sick(vector, measured))
            ):
                return None
            self._pending = []
        return self._pivot(pending, measured)

    def take(self, measured: Measured) -> Pivot | None:
        """Every step collected so far (None: none)."""
        with self._lock:
            pending, self._pending = self._pending, []
        return self._pivot(pending, measured) if pending else None

    def _pivot(self, pending: list[Row], measured: Measured) -> Pivot:
        step_times = self._steps.take_step_times()
        return packing.pivot(pending, step_times, measured, self._vitals, to_unix())


def numbers_in(logs: Mapping[str, object] | None) -> dict[str, float]:
    """The values of Keras's logs that are numbers."""
    out: dict[str, float] = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue  # strings or arrays some callbacks put in logs
    return out
