"""The packed vitals vector: its layout, and how fetched vectors become series.

Everything a step measures inside the compiled train step travels to the host as one float32
vector (``tf_vitals.step_vitals`` builds it), so that fetching it costs one transfer. This
module says, once, what sits where in that vector (:data:`HEAD`, then one norm per trainable
variable) and decodes it, once, for both recorders: ``VitalsCallback`` hands it a few dozen
steps at a time (:func:`pivot`, steps collected by the hooks become columns in the wire's
layout), ``Monitor`` one step (:func:`decode_one`). No TensorFlow here: numpy only.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from trainvitals.agent.vitals import StepVitals
from trainvitals.detect.nonfinite import loss_scale_skip
from trainvitals.protocol import Columns, ListColumns
from trainvitals.series import (
    CHANCE_LOSS,
    CHANCE_STEPS,
    GRAD_GLOBAL_NORM,
    GRAD_NORM_PREFIX,
    LOSS,
    LOSS_SCALE,
    LR,
    NONFINITE_GRADS,
    NONFINITE_INPUTS,
    NONFINITE_LOSS,
    STEP_TIME,
)

#: The NaN/Inf counts, in the order the step stacks them (one ``tf.cond`` computes all three).
COUNTS = (NONFINITE_LOSS, NONFINITE_INPUTS, NONFINITE_GRADS)
#: The scalars at the head of the packed vector; one gradient norm per variable follows.
HEAD = (LOSS, *COUNTS, GRAD_GLOBAL_NORM, LR, LOSS_SCALE)

# Positions in the head, by name: the only place the layout is read by position.
_LOSS, _NONFINITE_LOSS, _NONFINITE_INPUTS, _NONFINITE_GRADS, _NORM, _LR, _SCALE = (
    HEAD.index(name)
    for name in (
        LOSS, NONFINITE_LOSS, NONFINITE_INPUTS, NONFINITE_GRADS, GRAD_GLOBAL_NORM, LR, LOSS_SCALE
    )
)  # fmt: skip

#: One fetched vector (float32 as fetched, float64 once stacked).
Vector: TypeAlias = npt.NDArray[np.floating[Any]]
#: One step as the callback's hook keeps it: (step, ``time.monotonic()`` at its end, the
#: packed vector or None, Keras's numbers). A plain tuple: the hook builds one per step.
Row: TypeAlias = tuple[int, float, Vector | None, dict[str, float]]
#: ``(step, seconds, unix time)`` of the step time measured between two executions' starts.
StepTime: TypeAlias = tuple[int, float, float]


@dataclass(frozen=True, slots=True)
class Measured:
    """What a step's vector holds, as known once the step is traced.

    Args:
        loss: the step had a loss (else the head's loss is NaN, and not recorded).
        inputs: the step saw its batch.
        grads: the step saw the gradients (else the norms are NaN, and not recorded).
        names: the variables' paths, in the order of the per-variable norms.
        lr: the step read the optimizer's learning rate (else the head's is NaN, and not
            recorded).
        loss_scale: the step ran under a ``LossScaleOptimizer`` and read its scale.
        metrics: the names of Keras's metrics the step wrote after the vector, in its row of
            the device ring (:mod:`trainvitals.agent.ring`).
    """

    loss: bool = False
    inputs: bool = True
    grads: bool = False
    names: tuple[str, ...] = ()
    lr: bool = False
    loss_scale: bool = False
    #: Keras's metrics that follow the norms in the row the device ring keeps, in order.
    metrics: tuple[str, ...] = ()


class Decoded(NamedTuple):
    """A block of vectors as series: their columns, which rows have a NaN/Inf, and the
    per-variable norms of the last row recorded with them before the first such row."""

    columns: dict[str, ListColumns]
    sick: list[int]
    healthy_norms: dict[str, float] | None


class Pivot(NamedTuple):
    """Collected steps as columns (see :func:`pivot`)."""

    columns: dict[str, ListColumns]
    #: ``(step, time.monotonic())`` of each step's end, in step order, for the hang detector.
    clock: list[tuple[int, float]]
    #: Every step; the steps whose vector was all finite; the steps with a NaN/Inf.
    steps: list[int]
    healthy: list[int]
    sick: list[int]
    healthy_norms: dict[str, float] | None


def suspect(measured: Measured) -> tuple[list[int], list[int]]:
    """Where a step's NaN/Inf shows in the head: the positions of the three counts (zero on a
    healthy step) and of the values a healthy step keeps finite (the loss and the global
    norm, where measured)."""
    finite = [i for i, on in ((_LOSS, measured.loss), (_NORM, measured.grads)) if on]
    return [_NONFINITE_LOSS, _NONFINITE_INPUTS, _NONFINITE_GRADS], finite


def sick(vector: Vector, measured: Measured) -> bool:
    """Whether one fetched vector shows a NaN/Inf anywhere (cheap: the hook asks each step)."""
    return _sick(vector[: len(HEAD)].tolist(), measured)


def _sick(head: list[float], measured: Measured) -> bool:
    forward = bool(
        head[_NONFINITE_LOSS]
        or head[_NONFINITE_INPUTS]
        or (measured.loss and not math.isfinite(head[_LOSS]))
    )
    backward = bool(head[_NONFINITE_GRADS] or (measured.grads and not math.isfinite(head[_NORM])))
    if backward and not forward and measured.loss_scale and loss_scale_skip(head[_SCALE]):
        return False  # the loss scale at work: the optimizer skips the step and lowers it
    return forward or backward


def _maybe_sick(head: npt.NDArray[np.float64], measured: Measured) -> list[int]:
    """The rows of ``head`` that :func:`_sick` may call sick (a count not zero, or a loss or
    norm not finite), found without Python at every row; the rest are healthy."""
    counts, finite = suspect(measured)
    maybe = (head[:, counts] != 0).any(axis=1)
    if finite:
        maybe |= ~np.isfinite(head[:, finite]).all(axis=1)
    return np.flatnonzero(maybe).tolist()


def _recorded(measured: Measured) -> list[tuple[str, int]]:
    """The head's series that ``measured`` records, with their positions."""
    return [
        (name, i)
        for name, i, on in (
            (LOSS, _LOSS, measured.loss),
            (NONFINITE_LOSS, _NONFINITE_LOSS, measured.loss),
            (NONFINITE_INPUTS, _NONFINITE_INPUTS, measured.inputs),
            (LR, _LR, measured.lr),
            (LOSS_SCALE, _SCALE, measured.loss_scale),
            (GRAD_GLOBAL_NORM, _NORM, measured.grads),
            (NONFINITE_GRADS, _NONFINITE_GRADS, measured.grads),
        )
        if on
    ]


def head_series(block: npt.NDArray[np.float64], measured: Measured) -> dict[str, Vector]:
    """The head's recorded series of ``block``'s rows, by name, as views of its columns: what
    the urgency of rows not yet decoded is judged on."""
    return {name: block[:, i] for name, i in _recorded(measured)}


def decode(
    block: npt.NDArray[np.float64],
    steps: list[int],
    times: list[float],
    measured: Measured,
    vitals: StepVitals,
) -> Decoded:
    """The series of ``block``'s rows (one vector a row, at ``steps`` and unix ``times``):
    what ``measured`` says the step measured, the per-variable norms of the rows that
    ``vitals`` says are due, and Keras's metrics that follow the norms in a row of the device
    ring (:mod:`trainvitals.agent.ring`)."""
    head = block[:, : len(HEAD)]
    sick_rows = [j for j in _maybe_sick(head, measured) if _sick(head[j].tolist(), measured)]
    by_series = head.T.tolist()
    columns: dict[str, ListColumns] = {
        name: Columns(steps, times, by_series[i]) for name, i in _recorded(measured)
    }
    width = len(HEAD) + len(measured.names)
    for j, name in enumerate(measured.metrics):
        if name == CHANCE_LOSS:  # a level read at the start: kept for the first steps only
            first = bisect.bisect_right(steps, CHANCE_STEPS)  # steps come in order
            if first:
                chances = block[:first, width + j].tolist()
                columns[name] = Columns(steps[:first], times[:first], chances)
            continue
        columns[name] = Columns(steps, times, block[:, width + j].tolist())
    if not measured.grads:
        return Decoded(columns, sick_rows, None)
    names = measured.names
    norms = block[:, len(HEAD) : width]
    if block.shape[1] != width + len(measured.metrics):
        return Decoded(columns, sick_rows, None)
    due = vitals.due_rows(
        np.asarray(steps, np.int64), head[:, _NORM], head[:, _NONFINITE_GRADS], len(names)
    )
    if not due:
        return Decoded(columns, sick_rows, None)
    due_steps = [steps[j] for j in due]
    due_times = [times[j] for j in due]
    for name, values in zip(names, norms[due].T.tolist(), strict=True):
        columns[GRAD_NORM_PREFIX + name] = Columns(due_steps, due_times, values)
    first_sick = sick_rows[0] if sick_rows else len(steps)
    healthy_due = [j for j in due if j < first_sick]
    healthy_norms = None
    if healthy_due:
        healthy_norms = dict(zip(names, norms[healthy_due[-1]].tolist(), strict=True))
    return Decoded(columns, sick_rows, healthy_norms)


def decode_one(
    vector: Vector, step: int, measured: Measured, vitals: StepVitals
) -> tuple[dict[str, float], dict[str, float] | None]:
    """One step's vector as ``({series: value}, its per-variable norms if due and healthy)``."""
    block = np.asarray(vector, np.float64).reshape(1, -1)
    decoded = decode(block, [step], [0.0], measured, vitals)
    values = {name: column.values[0] for name, column in decoded.columns.items()}
    return values, decoded.healthy_norms


def micros(times: npt.NDArray[np.float64]) -> list[float]:
    """Unix ``times`` to the microsecond, each exactly as
    :func:`~trainvitals.protocol.whole_micros` rounds it (the same three float operations),
    without a call a time."""
    return (np.floor(times * 1e6 + 0.5) / 1e6).tolist()  # type: ignore[no-any-return]


def step_time_columns(step_times: Sequence[StepTime]) -> ListColumns:
    """The ``step_time`` series of the steps' ``(step, seconds, unix time)``."""
    steps, seconds, unix = zip(*step_times, strict=True)
    return Columns(list(steps), micros(np.asarray(unix, np.float64)), list(seconds))


def pivot(
    rows: list[Row],
    step_times: Sequence[StepTime],
    measured: Measured,
    vitals: StepVitals,
    to_unix: float,
) -> Pivot:
    """Steps collected by the callback's hooks as columns, series by series, in one go.

    ``rows`` may come out of order (Keras's worker threads); they are sorted here.
    ``to_unix`` turns their ``time.monotonic()`` into unix times (to the microsecond).
    """
    rows.sort(key=lambda row: row[0])
    steps = [row[0] for row in rows]
    times = micros(np.asarray([row[1] for row in rows], np.float64) + to_unix)
    columns: dict[str, ListColumns] = {}
    if step_times:
        columns[STEP_TIME] = step_time_columns(step_times)
    keys = rows[0][3].keys()
    if all(row[3].keys() == keys for row in rows):
        for key in keys:
            columns[key] = Columns(steps, times, [row[3][key] for row in rows])
    else:  # a metric that comes and goes: one step at a time
        for row, unix in zip(rows, times, strict=True):
            for key, value in row[3].items():
                column = columns.setdefault(key, Columns([], [], []))
                column[0].append(row[0])
                column[1].append(unix)
                column[2].append(value)
    measured_rows = [i for i, row in enumerate(rows) if row[2] is not None]
    healthy: list[int] = []
    sick_steps: list[int] = []
    healthy_norms = None
    if measured_rows:
        vectors = [row[2] for row in rows if row[2] is not None]
        every = len(measured_rows) == len(rows)  # then on the metrics' clock (buffer.py)
        decoded = decode(
            np.stack(vectors).astype(np.float64),
            steps if every else [steps[i] for i in measured_rows],
            times if every else [times[i] for i in measured_rows],
            measured,
            vitals,
        )
        columns.update(decoded.columns)
        sick_rows = set(decoded.sick)
        for j, i in enumerate(measured_rows):
            (sick_steps if j in sick_rows else healthy).append(steps[i])
        healthy_norms = decoded.healthy_norms
    clock = [(row[0], row[1]) for row in rows]
    return Pivot(columns, clock, steps, healthy, sick_steps, healthy_norms)


def values_at(columns: dict[str, ListColumns], step: int) -> dict[str, float]:
    """One step's values out of columns (for the rare step with a NaN/Inf)."""
    values = {}
    for name, (steps, _, column) in columns.items():
        for s, value in zip(reversed(steps), reversed(column), strict=True):
            if s == step:
                values[name] = value
                break
    return values
