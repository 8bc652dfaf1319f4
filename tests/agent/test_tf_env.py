"""The facts the detector reads: a classifier's loss at chance (in the hello), and the
regression loss whose level at chance the train step measures on each batch."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainvitals.agent.tf_env import (
    chance_of_regression,
    describe,
    loss_at_chance,
    regression_loss,
)


def compiled(units: int, loss: Any, **compile: Any) -> keras.Model:
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(units)(inputs))
    model.compile("sgd", loss, **compile)
    return model


@pytest.mark.parametrize(
    ("units", "loss", "classes"),
    [
        (10, "sparse_categorical_crossentropy", 10),
        (10, keras.losses.SparseCategoricalCrossentropy(from_logits=True), 10),
        (5, keras.losses.categorical_crossentropy, 5),
        (5, keras.losses.CategoricalCrossentropy(label_smoothing=0.1), 5),
        (1, "binary_crossentropy", 2),
        (3, keras.losses.BinaryCrossentropy(from_logits=True), 2),  # three yes/no outputs
    ],
)
def test_a_classifier_says_the_loss_of_a_guess(units: int, loss: Any, classes: int) -> None:
    chance = loss_at_chance(compiled(units, loss))
    assert chance is not None and chance["classes"] == classes
    assert chance["value"] == pytest.approx(math.log(classes))


@pytest.mark.parametrize(
    ("units", "loss", "compile"),
    [
        (1, "mse", {}),  # a regression
        (10, lambda y, p: keras.ops.mean(p), {}),  # a custom loss
        (10, keras.losses.SparseCategoricalCrossentropy(reduction="sum"), {}),  # grows with batch
        (1, "sparse_categorical_crossentropy", {}),  # one unit is no K-way choice
        (10, "sparse_categorical_crossentropy", {"loss_weights": [2.0]}),  # scaled
    ],
)
def test_anything_else_says_nothing(units: int, loss: Any, compile: dict[str, Any]) -> None:
    model = compiled(units, loss, **compile)
    assert loss_at_chance(model) is None
    assert "loss_at_chance" not in describe(model)


def test_an_unbuilt_model_says_nothing_until_it_is_built() -> None:
    model = keras.Sequential([keras.layers.Dense(3)])
    model.compile("sgd", "sparse_categorical_crossentropy")
    assert loss_at_chance(model) is None
    model.build((None, 4))
    assert describe(model)["loss_at_chance"]["classes"] == 3


TARGETS = np.random.default_rng(3).normal(2.0, 3.0, (64, 1)).astype("float32")


def level(loss: Any, data: Any) -> float:
    found = chance_of_regression(loss, data)
    assert found is not None
    return float(found)


@pytest.mark.parametrize(
    ("loss", "of_error"),
    [
        ("mse", np.square),
        ("mean_squared_error", np.square),
        (keras.losses.MeanSquaredError(), np.square),
        (keras.losses.mean_absolute_error, np.abs),
        ("log_cosh", lambda e: np.log(np.cosh(e))),
        (
            keras.losses.Huber(delta=2.0),
            lambda e: np.where(np.abs(e) <= 2, e * e / 2, 2 * np.abs(e) - 2),
        ),
    ],
)
def test_a_regression_loss_at_chance_is_its_loss_for_guesses_of_one_and_minus_one(
    loss: Any, of_error: Any
) -> None:
    found = regression_loss(compiled(1, loss))
    assert found is not None
    for data in ((np.zeros((64, 4)), TARGETS), (np.zeros((64, 4)), TARGETS, np.ones(64))):
        tensors = tuple(tf.constant(d) for d in data)
        expected = (of_error(TARGETS - 1).mean() + of_error(TARGETS + 1).mean()) / 2
        assert level(found, tensors) == pytest.approx(expected, rel=1e-5)
    # Integer targets are read as numbers.
    whole = tf.constant(np.arange(8).reshape(-1, 1))
    if loss == "mse":
        assert level(found, (tf.zeros((8, 4)), whole)) == pytest.approx(
            float(np.mean(np.arange(8) ** 2)) + 1
        )


def log_cosh(y_true: Any, y_pred: Any) -> Any:
    """The zoo's own log-cosh, which reads a classifier's labels as indices: called with the
    targets and a guess of 1 or -1, it would fail, and the train step with it."""
    picked = keras.ops.take_along_axis(y_pred, keras.ops.cast(y_true, "int32"), axis=1)
    return keras.ops.mean(keras.ops.log(keras.ops.cosh(picked)))


@pytest.mark.parametrize(
    ("units", "loss", "compile"),
    [
        (10, "sparse_categorical_crossentropy", {}),  # a classifier: its level is ln K
        (1, "mape", {}),  # a percentage: no level near zero
        (1, lambda y, p: keras.ops.mean(p - y), {}),  # a custom loss: never called twice
        (1, log_cosh, {}),  # ... even under the name of one of Keras's
        (1, keras.losses.MeanSquaredError(reduction="sum"), {}),  # grows with the batch
        (1, "mse", {"loss_weights": [3.0]}),  # scaled
    ],
)
def test_other_losses_have_no_regression_level(
    units: int, loss: Any, compile: dict[str, Any]
) -> None:
    assert regression_loss(compiled(units, loss, **compile)) is None


def test_a_batch_without_one_dense_target_has_no_level() -> None:
    mse = regression_loss(compiled(1, "mse"))
    x = tf.zeros((4, 4))
    assert chance_of_regression(mse, (x,)) is None  # no target
    assert chance_of_regression(mse, (x, (tf.zeros((4, 1)), tf.zeros((4, 1))))) is None
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0]])
    assert chance_of_regression(mse, (x, ragged)) is None
    assert chance_of_regression(mse, (x, tf.constant([["a"]] * 4))) is None


def test_a_subclassed_regression_has_a_level_though_it_never_says_its_outputs() -> None:
    class Net(keras.Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.out = keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            return self.out(x)

    net = Net()
    net.compile("sgd", "mse")
    mse = regression_loss(net)
    assert mse is not None
    y = tf.constant([[2.0], [0.0]])
    assert level(mse, (tf.zeros((2, 3)), y)) == pytest.approx(3.0)
    net.compile("sgd", "sparse_categorical_crossentropy")  # its classes are not known
    assert regression_loss(net) is None and loss_at_chance(net) is None
