"""A step's vitals as series values: what the callback and ``Monitor`` both record.

No TensorFlow here: the tensors are computed by ``tf_vitals.step_vitals`` and fetched as one
vector; this decides which series that vector becomes, and when the per-variable gradient norms
are worth recording (every N steps, and at once when the gradients turn non-finite or jump).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence

from trainvitals.series import (
    GRAD_GLOBAL_NORM,
    GRAD_NORM_PREFIX,
    LOSS,
    NONFINITE_GRADS,
    NONFINITE_INPUTS,
    NONFINITE_LOSS,
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


def variable_norms(values: Mapping[str, float]) -> dict[str, float]:
    """The per-variable gradient norms among a step's values, by variable path."""
    prefix = GRAD_NORM_PREFIX
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}


class StepVitals:
    """Series values of one step's packed vitals. Thread-safe: Keras may deliver steps from
    several threads at once.

    Args:
        grad_norms_every: steps between per-variable gradient norms.
    """

    def __init__(self, grad_norms_every: int = 10) -> None:
        self._every = max(int(grad_norms_every), 1)
        self._last_norm = math.nan
        self._lock = threading.Lock()

    def values(
        self,
        step: int,
        head: Mapping[str, float],
        norms: Sequence[float],
        names: Sequence[str],
        *,
        loss: bool,
        inputs: bool,
        grads: bool,
    ) -> dict[str, float]:
        """``head`` and ``norms`` as ``tf_vitals.unpack`` gives them; ``loss``, ``inputs`` and
        ``grads`` say which of them the step measured."""
        values: dict[str, float] = {}
        if loss:
            values[LOSS] = head[LOSS]
            values[NONFINITE_LOSS] = head[NONFINITE_LOSS]
        if inputs:
            values[NONFINITE_INPUTS] = head[NONFINITE_INPUTS]
        if not grads:
            return values
        norm = values[GRAD_GLOBAL_NORM] = head[GRAD_GLOBAL_NORM]
        nonfinite = values[NONFINITE_GRADS] = head[NONFINITE_GRADS]
        if self.due(step, norm, nonfinite) and len(norms) == len(names):
            values.update({f"grad/norm/{n}": float(v) for n, v in zip(names, norms, strict=True)})
        return values

    def due(self, step: int, norm: float, nonfinite: float) -> bool:
        """Whether step ``step`` records the per-variable norms: every N steps, and on a step
        whose gradients are non-finite or whose global norm jumps."""
        with self._lock:
            due = (
                step % self._every == 0
                or norm > JUMP * self._last_norm
                or not math.isfinite(norm)
                or nonfinite > 0
            )
            if due:
                self._last_norm = norm
        return due
