"""The packed vitals vector: what ``tf_vitals.step_vitals`` packs, ``packing`` decodes, in
bulk for the callback (``pivot``) and one step at a time for ``Monitor`` (``decode_one``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from trainvitals.agent import packing
from trainvitals.agent.packing import Measured, Row
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import Columns, whole_micros
from trainvitals.series import CHANCE_LOSS, CHANCE_STEPS

NAMES = ("dense/kernel", "dense/bias")
ALL = Measured(loss=True, inputs=True, grads=True, names=NAMES)


def vector(
    loss: float = 0.5,
    norms: tuple[float, float] = (3.0, 4.0),
    lr: float = 0.01,
    scale: float = math.nan,
    **counts: float,
) -> np.ndarray:
    """A packed vector built by name, in :data:`packing.HEAD`'s order."""
    head = {
        "loss": loss,
        "nonfinite/loss": counts.get("loss", 0.0),
        "nonfinite/inputs": counts.get("inputs", 0.0),
        "nonfinite/grads": counts.get("grads", 0.0),
        "grad/global_norm": math.hypot(*norms),
        "lr": lr,
        "loss_scale": scale,
    }
    return np.array([head[name] for name in packing.HEAD] + list(norms), np.float32)


def test_step_vitals_packs_what_packing_decodes() -> None:
    tf = pytest.importorskip("tensorflow")
    kernel = tf.Variable(np.ones((3, 2), np.float32), name="kernel")
    bias = tf.Variable(np.zeros(2, np.float32), name="bias")
    x = np.ones((4, 3), np.float32)
    x[1, 2] = np.nan

    from trainvitals.agent.tf_vitals import step_vitals

    @tf.function  # type: ignore[untyped-decorator]
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel) + bias))
        grads = tape.gradient(loss, [kernel, bias])
        return loss, grads, step_vitals(loss, x, grads, lr=tf.constant(0.125))

    loss, grads, packed = step(tf.ones((4, 3)))
    values, norms = packing.decode_one(packed.numpy(), 10, ALL, StepVitals(10))
    assert "lr" not in values  # not measured: not decoded
    with_lr = Measured(loss=True, inputs=True, grads=True, names=NAMES, lr=True)
    assert packing.decode_one(packed.numpy(), 10, with_lr, StepVitals(10))[0]["lr"] == 0.125
    assert math.isclose(values["loss"], float(loss), rel_tol=1e-6)
    assert [values[f"nonfinite/{n}"] for n in ("loss", "inputs", "grads")] == [0, 0, 0]
    expected = [float(tf.norm(g)) for g in grads]
    assert [values[f"grad/norm/{n}"] for n in NAMES] == pytest.approx(expected, rel=1e-6)
    assert values["grad/global_norm"] == pytest.approx(math.hypot(*expected), rel=1e-6)
    assert norms == pytest.approx(dict(zip(NAMES, expected, strict=True)), rel=1e-6)

    _, _, sick = step(tf.constant(x))
    values, norms = packing.decode_one(sick.numpy(), 11, ALL, StepVitals(10))
    assert (values["nonfinite/loss"], values["nonfinite/inputs"]) == (1, 1)
    assert values["nonfinite/grads"] == 8  # every gradient element
    assert packing.sick(sick.numpy(), ALL) and norms is None


def test_bulk_and_one_step_decode_alike() -> None:
    vectors = {step: vector(loss=step / 10, norms=(step, 1.0)) for step in range(1, 9)}
    vectors[7] = vector(loss=math.inf, norms=(math.inf, 1.0), grads=2.0)  # NaN != NaN
    rows: list[Row] = [(s, 100.0 + s, v, {"mae": s / 100}) for s, v in vectors.items()]
    bulk = packing.pivot(rows[::-1], [], ALL, StepVitals(3), to_unix=1e9)
    one = StepVitals(3)
    for step, v in vectors.items():
        values, _ = packing.decode_one(v, step, ALL, one)
        assert packing.values_at(bulk.columns, step) == {**values, "mae": step / 100}, step


def test_pivot_sorts_steps_and_names_the_sick_ones() -> None:
    rows: list[Row] = [
        (3, 3.0, vector(loss=math.inf), {"mae": 0.3}),
        (1, 1.0, vector(), {"mae": 0.1, "lr": 0.01}),
        (2, 2.0, vector(norms=(30.0, 40.0)), {"mae": 0.2}),
        (4, 4.0, None, {"mae": 0.4}),  # a step Keras logged without the vector
    ]
    pivot = packing.pivot(rows, [(2, 0.25, 1e9 + 2)], ALL, StepVitals(2), to_unix=1e9)
    assert (pivot.steps, pivot.healthy, pivot.sick) == ([1, 2, 3, 4], [1, 2], [3])
    assert pivot.clock == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    columns = pivot.columns
    assert columns["step_time"] == Columns([2], [1e9 + 2], [0.25])
    assert columns["mae"] == Columns(
        [1, 2, 3, 4], [1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 4], [0.1, 0.2, 0.3, 0.4]
    )
    assert columns["lr"] == Columns([1], [1e9 + 1], [0.01])
    assert columns["loss"].steps == [1, 2, 3] and columns["loss"].values[2] == math.inf
    # Due: step 2 (every 2nd); the healthy norms are those of the last due step before step 3.
    assert columns["grad/norm/dense/kernel"] == Columns([2], [1e9 + 2], [30.0])
    assert pivot.healthy_norms == {"dense/kernel": 30.0, "dense/bias": 40.0}


def test_times_go_out_to_the_microsecond() -> None:
    rows: list[Row] = [(1, 0.0000002, vector(), {}), (2, 0.0123456789, vector(), {})]
    step_time = [(2, 0.25, 1795317434.1234567)]
    pivot = packing.pivot(rows, step_time, ALL, StepVitals(2), to_unix=1795317434.0)
    assert pivot.columns["loss"].times == [1795317434.0, 1795317434.012346]
    assert pivot.columns["step_time"].times == [1795317434.123457]
    assert whole_micros(-0.0000015) == -0.000001 and whole_micros(3.0) == 3.0


def test_a_step_the_loss_scale_skips_is_recorded_but_not_sick() -> None:
    scaled = Measured(loss=True, inputs=True, grads=True, names=NAMES, loss_scale=True)
    skip = vector(norms=(math.inf, 1.0), grads=3.0, scale=2.0**15)
    assert not packing.sick(skip, scaled)  # no autopsy, no protective stop
    assert packing.sick(skip, ALL)  # a run without loss scaling: a real overflow
    assert packing.sick(vector(norms=(math.inf, 1.0), grads=3.0, scale=1.0), scaled)
    assert packing.sick(vector(loss=math.inf, grads=3.0, scale=2.0**15), scaled)  # the loss too
    values, _ = packing.decode_one(skip, 5, scaled, StepVitals(10))
    assert (values["loss_scale"], values["nonfinite/grads"]) == (2.0**15, 3.0)


def test_only_what_the_step_measured_is_decoded_and_judged() -> None:
    nan_loss = vector(loss=math.nan)
    without_loss = Measured(loss=False, inputs=True, grads=True, names=NAMES)
    assert packing.sick(nan_loss, ALL) and not packing.sick(nan_loss, without_loss)
    values, _ = packing.decode_one(nan_loss, 1, without_loss, StepVitals(1))
    assert "loss" not in values and "nonfinite/loss" not in values
    values, _ = packing.decode_one(vector(), 1, Measured(names=("one",)), StepVitals(1))
    assert values == {"nonfinite/inputs": 0.0}
    # Norms that do not match the names (an untraced model) are left out, not misnamed.
    values, norms = packing.decode_one(
        vector(), 1, Measured(grads=True, names=("one",)), StepVitals(1)
    )
    assert not any(name.startswith("grad/norm/") for name in values) and norms is None


def test_the_learning_rate_is_read_where_the_optimizer_has_one() -> None:
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    from trainvitals.agent.tf_vitals import learning_rate_of

    assert float(learning_rate_of(keras.optimizers.SGD(0.5))) == 0.5
    schedule = keras.optimizers.schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
    assert float(learning_rate_of(keras.optimizers.SGD(schedule))) == 1.0  # at iteration 0
    assert learning_rate_of(object()) is None  # an optimizer of its own: nothing, no error


def test_the_rows_found_sick_in_bulk_are_those_found_one_by_one() -> None:
    """``decode`` looks only at the rows that may be sick; the rest must be healthy."""
    rng = np.random.default_rng(5)
    for measured in (ALL, Measured(loss=False, grads=True, names=ALL.names), Measured()):
        width = len(packing.HEAD) + len(measured.names)
        block = rng.random((400, width))
        block[:, 1:4] = 0.0
        for column in range(width):
            hit = rng.random(400) < 0.01
            block[hit, column] = rng.choice([math.nan, math.inf, -math.inf, 3.0])
        steps = list(range(1, 401))
        decoded = packing.decode(block, steps, [0.0] * 400, measured, StepVitals(10))
        one_by_one = [j for j in range(400) if packing.sick(block[j], measured)]
        assert decoded.sick == one_by_one
        assert one_by_one  # the block has sick rows to find


def test_times_in_bulk_are_rounded_as_one_at_a_time() -> None:
    rng = np.random.default_rng(11)
    times = 1795317434.0 + rng.random(20_000) * 1e6
    times[:4] = [1795317434.1234567, 1795317434.0000005, 1e9 + 0.5e-6, 0.0]
    assert packing.micros(times) == [whole_micros(t) for t in times.tolist()]


def test_a_regression_loss_at_chance_is_kept_for_the_first_steps_only() -> None:
    """It is the level the loss starts at: read on the first steps, not stored for ever."""
    measured = Measured(loss=True, grads=True, names=NAMES, metrics=("mae", CHANCE_LOSS))
    steps = list(range(CHANCE_STEPS - 2, CHANCE_STEPS + 3))
    rows = [np.append(vector(), [0.1 * s, 1.5 + s]) for s in steps]
    block = np.stack(rows).astype(np.float64)
    times = [float(s) for s in steps]
    columns = packing.decode(block, steps, times, measured, StepVitals(10)).columns
    assert columns["mae"].steps == steps
    assert columns[CHANCE_LOSS] == Columns(steps[:3], times[:3], [1.5 + s for s in steps[:3]])
    later = [s + 10 for s in steps]
    columns = packing.decode(block, later, times, measured, StepVitals(10)).columns
    assert CHANCE_LOSS not in columns and columns["mae"].steps == later
