"""The hello's facts the detector reads: a classifier's loss at chance."""

from __future__ import annotations

import math
from typing import Any

import keras
import pytest

from trainvitals.agent.tf_env import describe, loss_at_chance


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
