"""When a step's vitals are healthy, and when its per-variable gradient norms are recorded.

No TensorFlow here: the tensors are computed by ``tf_vitals.step_vitals`` and fetched as one
vector, which :mod:`trainvitals.agent.packing` decodes; this says when the per-variable
gradient norms are worth recording (every N steps, and at once when the gradients turn
non-finite or jump, or when the set of trained variables changes), and whether a step's
series values are all finite.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from trainvitals.series import (
    GRAD_GLOBAL_NORM,
    GRAD_NORM_PREFIX,
    LOSS,
    NONFINITE_PREFIX,
)

#: A global norm this many times the last one recorded also records the per-variable norms.
JUMP = 10.0


def healthy(values: Mapping[str, float]) -> bool:
    """Whether a step's vitals are all finite and count no NaN/Inf anywhere."""
    for name, value in values.items():
        if name.startswith(NONFINITE_PREFIX):
            if value != 0:
                return False
        elif name in (LOSS, GRAD_GLOBAL_NORM) or name.startswith(GRAD_NORM_PREFIX):
            if not math.isfinite(value):
                return False
    return True


class StepVitals:
    """When a step records its per-variable gradient norms. Thread-safe: Keras may deliver
    steps from several threads at once.

    Args:
        grad_norms_every: steps between per-variable gradient norms.
    """

    def __init__(self, grad_norms_every: int = 10) -> None:
        self._every = max(int(grad_norms_every), 1)
        self._last_norm = math.nan
        self._variables: int | None = None
        self._lock = threading.Lock()

    def due(self, step: int, norm: float, nonfinite: float, variables: int = 0) -> bool:
        """Whether step ``step`` records the per-variable norms: every N steps, and on a step
        whose gradients are non-finite or whose global norm jumps, or whose gradients are of
        another number of ``variables`` than the last step's (a backbone unfrozen or frozen:
        the server learns at once which variables train now)."""
        with self._lock:
            changed = self._variables is not None and variables != self._variables
            self._variables = variables
            due = (
                step % self._every == 0
                or changed
                or norm > JUMP * self._last_norm
                or not math.isfinite(norm)
                or nonfinite > 0
            )
            if due:
                self._last_norm = norm
        return due

    def due_rows(
        self,
        steps: npt.NDArray[np.int64],
        norms: npt.NDArray[np.float64],
        nonfinite: npt.NDArray[np.float64],
        variables: int = 0,
    ) -> list[int]:
        """The positions of the rows that record their per-variable norms, as :meth:`due`
        would say for each row in turn (``steps`` ascending, one row a step, all of them
        with ``variables`` variables), without Python at every row.

        A jump is judged against the norm of the last row recorded, so the rows are
        sequential in principle; but while no row jumps above the rows that are due anyway
        (every N steps, non-finite, a changed count of variables), those are exactly the rows
        due. Only a block in which some row might jump goes row by row."""
        count = len(steps)
        if count == 0:
            return []
        norms = np.asarray(norms, np.float64)  # compared as due compares Python floats
        with self._lock:
            last_norm = self._last_norm
            due = (steps % self._every == 0) | ~np.isfinite(norms) | (nonfinite > 0)
            if self._variables is not None and variables != self._variables:
                due[0] = True
            # Each row's last recorded norm, were the rows due anyway the only ones recorded.
            latest = np.maximum.accumulate(np.where(due, np.arange(count), -1))
            shifted = np.concatenate([[-1], latest[:-1]])
            before = np.where(shifted >= 0, norms[np.maximum(shifted, 0)], last_norm)
            with np.errstate(invalid="ignore"):
                jumps = ~due & (norms > JUMP * before)  # a row due anyway jumps to no effect
            if not jumps.any():
                self._variables = variables
                rows = np.flatnonzero(due)
                if len(rows):
                    self._last_norm = float(norms[rows[-1]])
                return rows.tolist()
        return [
            j
            for j, (step, norm, bad) in enumerate(
                zip(steps.tolist(), norms.tolist(), nonfinite.tolist(), strict=True)
            )
            if self.due(step, norm, bad, variables)
        ]
