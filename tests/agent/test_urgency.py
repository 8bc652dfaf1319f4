"""Which recorded points are sent at the next look rather than at the next send."""

from __future__ import annotations

import math

from trainvitals.agent.urgency import MIN_HISTORY, RISE, Urgency
from trainvitals.protocol import Columns, SeqColumns
from trainvitals.series import GRAD_GLOBAL_NORM, LOSS, NONFINITE_GRADS, NONFINITE_INPUTS


def norms(values: list[float]) -> dict[str, SeqColumns]:
    return {GRAD_GLOBAL_NORM: Columns(list(range(len(values))), [0.0] * len(values), values)}


def test_a_nan_anywhere_is_urgent_and_healthy_values_are_not() -> None:
    urgency = Urgency()
    assert not urgency.values({LOSS: 0.5, NONFINITE_INPUTS: 0.0, "acc": math.nan})
    assert urgency.values({NONFINITE_INPUTS: 3.0})
    assert urgency.values({NONFINITE_GRADS: math.nan})  # a count that is itself broken
    assert urgency.values({LOSS: math.inf})
    assert urgency.columns({LOSS: Columns([1, 2], [0.0, 0.0], [0.4, math.nan])})
    assert urgency.values({GRAD_GLOBAL_NORM: math.nan})


def test_a_steep_rise_of_the_gradient_norm_is_urgent_once_there_is_a_history() -> None:
    urgency = Urgency()
    assert not urgency.columns(norms([1.0] * (MIN_HISTORY - 1) + [100.0]))  # too little history
    urgency = Urgency()
    assert not urgency.columns(norms([1.0 + 0.01 * (i % 7) for i in range(MIN_HISTORY)]))
    assert not urgency.columns(norms([1.5, 2.0, 0.2]))  # noise, below RISE x the median
    assert urgency.columns(norms([1.1, RISE * 1.05]))
    assert urgency.columns(norms([RISE * 1.05] * 400))  # against the median before them
    # The median moves with the norm: the new level, held, is no longer a rise.
    assert not urgency.values({GRAD_GLOBAL_NORM: RISE * 1.1})
    assert urgency.values({GRAD_GLOBAL_NORM: RISE * RISE * 1.1})
