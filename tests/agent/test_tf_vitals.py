"""When per-variable gradient norms are recorded (no TensorFlow needed)."""

from __future__ import annotations

import math

from trainvitals.agent.vitals import StepVitals

NAMES = ["dense/kernel", "dense/bias"]


def head(norm: float, nonfinite_grads: float = 0.0) -> dict[str, float]:
    return {
        "loss": 0.5,
        "nonfinite/loss": 0.0,
        "nonfinite/inputs": 0.0,
        "nonfinite/grads": nonfinite_grads,
        "grad/global_norm": norm,
    }


def recorded(vitals: StepVitals, step: int, norm: float, nonfinite: float = 0.0) -> bool:
    values = vitals.values(
        step, head(norm, nonfinite), [norm, 0.1], NAMES, loss=True, inputs=True, grads=True
    )
    return "grad/norm/dense/kernel" in values


def test_per_variable_norms_every_n_steps_and_when_something_happens() -> None:
    vitals = StepVitals(grad_norms_every=5)
    assert [s for s in range(1, 11) if recorded(vitals, s, 1.0)] == [5, 10]
    assert recorded(vitals, 11, 12.0)  # more than tenfold the last recorded norm
    assert not recorded(vitals, 12, 13.0)  # no longer a jump against the new reference
    assert recorded(vitals, 13, math.inf)
    assert recorded(vitals, 14, 1.0, nonfinite=3)


def test_only_what_the_step_measured() -> None:
    values = StepVitals().values(
        1, head(1.0), [1.0, 0.1], NAMES, loss=False, inputs=True, grads=False
    )
    assert values == {"nonfinite/inputs": 0.0}
