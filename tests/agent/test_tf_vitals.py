"""When per-variable gradient norms are recorded (no TensorFlow needed)."""

from __future__ import annotations

import math

import numpy as np

from trainvitals.agent.packing import Measured, decode_one
from trainvitals.agent.vitals import StepVitals

NAMES = ("dense/kernel", "dense/bias")


def vector(norm: float, nonfinite_grads: float = 0.0) -> np.ndarray:
    """A packed vector: loss, NaN/Inf in the loss, the inputs, the grads, global norm, the
    learning rate and the loss scale (none); norms."""
    head = [0.5, 0.0, 0.0, nonfinite_grads, norm, math.nan, math.nan]
    return np.array([*head, norm, 0.1], np.float32)


def recorded(
    vitals: StepVitals, step: int, norm: float, nonfinite: float = 0.0, names: int = 2
) -> bool:
    """Whether the step records its per-variable norms (``names``: how many variables its
    gradients are of: the last ``names`` of ``dense/kernel``, ``dense/bias``)."""
    measured = Measured(loss=True, inputs=True, grads=True, names=NAMES[-names:])
    packed = vector(norm, nonfinite)
    values, _ = decode_one(packed[: len(packed) - 2 + names], step, measured, vitals)
    return f"grad/norm/{NAMES[-1]}" in values


def test_per_variable_norms_every_n_steps_and_when_something_happens() -> None:
    vitals = StepVitals(grad_norms_every=5)
    assert [s for s in range(1, 11) if recorded(vitals, s, 1.0)] == [5, 10]
    assert recorded(vitals, 11, 12.0)  # more than tenfold the last recorded norm
    assert not recorded(vitals, 12, 13.0)  # no longer a jump against the new reference
    assert recorded(vitals, 13, math.inf)
    assert recorded(vitals, 14, 1.0, nonfinite=3)


def test_per_variable_norms_at_once_when_the_trained_variables_change() -> None:
    vitals = StepVitals(grad_norms_every=10)
    assert [s for s in range(1, 6) if recorded(vitals, s, 1.0, names=1)] == []
    assert recorded(vitals, 6, 1.5, names=2)  # a frozen layer unfrozen: its gradient joins
    assert not recorded(vitals, 7, 1.5, names=2)
    assert recorded(vitals, 8, 1.0, names=1)  # and frozen again


def test_only_what_the_step_measured() -> None:
    measured = Measured(loss=False, inputs=True, grads=False, names=NAMES)
    values, norms = decode_one(vector(1.0), 1, measured, StepVitals())
    assert (values, norms) == ({"nonfinite/inputs": 0.0}, None)


def test_a_block_of_rows_records_the_norms_of_the_rows_each_would_alone() -> None:
    """``due_rows`` (one block, no Python at each row) against ``due`` row by row, over
    blocks with jumps, non-finite norms and counts, and changes of the trained variables."""
    rng = np.random.default_rng(3)
    for trial in range(300):
        every = int(rng.integers(1, 12))
        bulk, one = StepVitals(every), StepVitals(every)
        step = 1
        for _ in range(int(rng.integers(1, 5))):
            count = int(rng.integers(0, 40))
            steps = np.arange(step, step + count, dtype=np.int64)
            step += count
            norms = rng.lognormal(0.0, 0.3, count)
            special = rng.random(count)
            norms[special < 0.03 * (trial % 4)] *= 50.0  # jumps, in some blocks only
            norms[special > 0.99] = rng.choice([math.nan, math.inf, 0.0])
            nonfinite = np.where(rng.random(count) > 0.98, 2.0, 0.0)
            variables = int(rng.choice([2, 2, 2, 1]))
            expected = [
                j
                for j in range(count)
                if one.due(int(steps[j]), float(norms[j]), float(nonfinite[j]), variables)
            ]
            assert bulk.due_rows(steps, norms, nonfinite, variables) == expected, trial
