"""Every NaN traced to its first cause, with that cause's remedy: a table of NaN origins,
each a real small Keras model trained with ``fit`` (and custom loops with ``Monitor``),
and the verdict each must get in the run's ``nonfinite`` alert (docs/alerts.md lists them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import trainvitals  # noqa: E402
from harness.polling import wait_for  # noqa: E402
from harness.processes import ServerProcess  # noqa: E402
from trainvitals.detect.numeric import CAUSE_HINTS  # noqa: E402

SAMPLES, BATCH, BAD_BATCH = 64, 8, 3  # 8 steps; the bad values sit in the 4th batch


@dataclass
class Origin:
    """A NaN origin: the model and fit's arguments it trains with, and what must be said."""

    build: Callable[[], tuple[Any, dict[str, Any]]]
    cause: str
    words: str  # in the alert's message
    domain: str | None = None


def _data(features: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 1.5, size=(SAMPLES, features)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _row(sample: int = 2) -> int:
    return BAD_BATCH * BATCH + sample


def _model(*layers: Any, features: int = 4, loss: Any = "mse", optimizer: Any = "sgd") -> Any:
    model = keras.Sequential([keras.Input((features,)), *layers])
    model.compile(optimizer=optimizer, loss=loss)
    return model


def nan_in_inputs() -> tuple[Any, dict[str, Any]]:
    x, y = _data()
    x[_row(), 1] = np.nan
    return _model(keras.layers.Dense(1)), {"x": x, "y": y}


def inf_in_inputs() -> tuple[Any, dict[str, Any]]:
    x, y = _data()
    x[_row(5), 3] = np.inf
    return _model(keras.layers.Dense(1)), {"x": x, "y": y}


def nan_in_targets() -> tuple[Any, dict[str, Any]]:
    x, y = _data()
    y[_row()] = np.nan
    return _model(keras.layers.Dense(1)), {"x": x, "y": y}


def log_of_a_negative_without_variables() -> tuple[Any, dict[str, Any]]:
    """The issue's case: a layer without variables takes the log of its input; one sample
    carries a finite negative value; relu(NaN) is 0 on oneDNN, so the loss stays finite."""
    x, y = _data()
    x[_row(), 0] = -0.5
    log = keras.layers.Lambda(lambda t: keras.ops.log(t), name="log_features")
    return _model(log, keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)), {
        "x": x,
        "y": y,
    }


def division_by_zero() -> tuple[Any, dict[str, Any]]:
    x, y = _data()
    x[_row(), 2] = 0.0
    inverse = keras.layers.Lambda(lambda t: 1.0 / t, name="inverse")
    return _model(inverse, keras.layers.Dense(1)), {"x": x, "y": y}


def exp_overflow() -> tuple[Any, dict[str, Any]]:
    x, y = _data()
    x[_row(), 1] = 200.0
    exp = keras.layers.Lambda(lambda t: keras.ops.exp(t), name="exp")
    return _model(exp, keras.layers.Dense(1)), {"x": x, "y": y}


def log_of_zero_in_the_loss() -> tuple[Any, dict[str, Any]]:
    def log_error(y_true: Any, y_pred: Any) -> Any:
        return keras.ops.mean(keras.ops.square(y_pred - keras.ops.log(y_true)), axis=-1)

    x, y = _data()
    y[_row()] = 0.0
    return _model(keras.layers.Dense(1), loss=log_error), {"x": x, "y": y}


def sqrt_at_zero_backward_only() -> tuple[Any, dict[str, Any]]:
    """sqrt(relu(z)) is finite forward; its derivative at a relu's zero is infinite."""
    x, y = _data()
    x[_row()] = 0.0
    root = keras.layers.Lambda(lambda t: keras.ops.sqrt(keras.ops.relu(t)), name="root")
    dense = keras.layers.Dense(2, kernel_initializer="ones", bias_initializer="zeros")
    return _model(dense, root, keras.layers.Dense(1)), {"x": x, "y": y}


def poisoned_before_fit() -> tuple[Any, dict[str, Any]]:
    """A restored checkpoint with NaN in it."""
    x, y = _data()
    model = _model(keras.layers.Dense(4, name="restored"), keras.layers.Dense(1))
    kernel = model.get_layer("restored").kernel
    poisoned = kernel.numpy()
    poisoned[0, 0] = np.nan
    kernel.assign(poisoned)
    return model, {"x": x, "y": y}


def learning_rate_blowup() -> tuple[Any, dict[str, Any]]:
    """Finite gradients whose update overflows the weights."""
    x, y = _data()
    sgd = keras.optimizers.SGD(learning_rate=1e38)
    return _model(keras.layers.Dense(1, name="head"), optimizer=sgd), {"x": x, "y": y * 100}


def test_labels_outside_a_sparse_losss_classes_are_named() -> None:
    """On a CPU, TensorFlow's sparse cross-entropy raises on such a label (the run ends with
    the exception); on a GPU the loss turns NaN, and the autopsy names the labels."""
    from trainvitals.agent import autopsy

    x, _ = _data()
    labels = np.zeros(SAMPLES, "int32")
    labels[_row()] = 7  # three classes
    model = _model(
        keras.layers.Dense(3, activation="softmax"), loss="sparse_categorical_crossentropy"
    )
    report = autopsy.replay(model, x, labels)
    assert report["cause"] == "labels" and "found [7]" in report["verdict"], report


ORIGINS = {
    "nan_in_inputs": Origin(nan_in_inputs, "inputs", "input"),
    "inf_in_inputs": Origin(inf_in_inputs, "inputs", "input"),
    "nan_in_targets": Origin(nan_in_targets, "labels", "targets"),
    "log_of_a_negative": Origin(
        log_of_a_negative_without_variables, "layer", "log_features", domain="negative"
    ),
    "division_by_zero": Origin(division_by_zero, "layer", "inverse", domain="zero"),
    "exp_overflow": Origin(exp_overflow, "layer", "'exp'", domain="overflow"),
    "log_of_zero_in_the_loss": Origin(log_of_zero_in_the_loss, "loss", "loss function"),
    "sqrt_at_zero": Origin(sqrt_at_zero_backward_only, "backward", "gradients"),
    "poisoned_before_fit": Origin(poisoned_before_fit, "poisoned_weights", "restored"),
    "learning_rate_blowup": Origin(learning_rate_blowup, "lr_blowup", "head"),
}


def nonfinite_alert(server: ServerProcess, run_id: str) -> dict[str, Any]:
    def autopsied() -> dict[str, Any] | None:
        alerts = server.get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
        for alert in alerts:
            if alert["rule"] == "nonfinite" and "autopsy" in alert["evidence"]:
                return dict(alert)
        return None

    return wait_for(autopsied, timeout=30, what="the nonfinite alert with its autopsy")


def fitted(server: ServerProcess, name: str, build: Callable[[], Any]) -> tuple[Any, str]:
    keras.utils.set_random_seed(2)
    model, arguments = build()
    vitals = trainvitals.VitalsCallback(
        server=server.url, run_name=name, system_metrics=False, watchdog=False
    )
    model.fit(**arguments, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    return model, vitals.run.id


@pytest.mark.parametrize("name", list(ORIGINS))
def test_fit_names_the_first_cause_of_each_nan_with_its_remedy(
    module_server: ServerProcess, name: str
) -> None:
    origin = ORIGINS[name]
    _, run_id = fitted(module_server, name, origin.build)
    alert = nonfinite_alert(module_server, run_id)
    autopsy = alert["evidence"]["autopsy"]
    assert autopsy.get("cause") == origin.cause, autopsy
    assert origin.words in alert["message"], alert["message"]
    assert alert["hint"] == CAUSE_HINTS[origin.cause]
    if origin.domain is not None:
        assert autopsy["domain"] == origin.domain, autopsy
    if origin.cause == "inputs":
        assert autopsy["samples"] == [2 if name == "nan_in_inputs" else 5]


def test_a_remedy_is_never_another_causes() -> None:
    hints = list(CAUSE_HINTS.values())
    assert len(set(hints)) == len(hints)
    assert "clipnorm" not in CAUSE_HINTS["layer"] or "does not help" in CAUSE_HINTS["layer"]


def test_a_monitor_loop_names_the_layer_without_variables(
    module_server: ServerProcess, tmp_path: Path
) -> None:
    """A custom loop that applies the NaN's update before the autopsy: the replay still
    finds the layer before the poisoned ones."""
    keras.utils.set_random_seed(2)
    model, arguments = log_of_a_negative_without_variables()
    optimizer = keras.optimizers.SGD(0.01)
    x, y = arguments["x"], arguments["y"]
    with trainvitals.Monitor(
        server=module_server.url, run_name="loop-log", model=model, system_metrics=False,
        watchdog=False,
    ) as monitor:  # fmt: skip
        for step in range(SAMPLES // BATCH):
            xb, yb = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            monitor.log(step + 1, loss=loss, grads=grads, inputs=xb, targets=yb)
    assert monitor.run is not None
    autopsy = nonfinite_alert(module_server, monitor.run.id)["evidence"]["autopsy"]
    assert autopsy["cause"] == "layer" and autopsy["layer"] == "log_features", autopsy
    assert autopsy["domain"] == "negative"


def test_a_healthy_fit_never_keeps_a_batch(module_server: ServerProcess) -> None:
    """The copy sits in a branch a healthy step never takes."""
    keras.utils.set_random_seed(2)
    x, y = _data()
    model = _model(keras.layers.Dense(1))
    vitals = trainvitals.VitalsCallback(
        server=module_server.url, run_name="healthy", system_metrics=False, watchdog=False
    )
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[vitals])
    assert vitals._tap is not None and vitals._tap.bad_step is not None
    assert vitals._tap.bad_step.take() is None


@pytest.mark.usefixtures("weights_checked_every_time")
def test_the_weights_check_never_files_a_nan_before_the_step_that_made_it(
    module_server: ServerProcess,
) -> None:
    """The sender reads the weights while training goes on: a check made due at step 20 and
    read at step 27 holds step 27's weights, and is filed there (the zoo found checks filed
    at the multiple of ``weights_every`` before a NaN that came after it)."""
    import time

    poison_at = 27

    class Slow(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            time.sleep(0.02)  # a look lands in the middle of training
            if batch + 1 == poison_at:
                kernel = self.model.layers[0].kernel
                kernel.assign(np.full(kernel.shape, np.nan, "float32"))

    keras.utils.set_random_seed(2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    model = _model(keras.layers.Dense(1))
    vitals = trainvitals.VitalsCallback(
        server=module_server.url, run_name="late-read", system_metrics=False, watchdog=False,
        weights_every=10, read_interval=0.05,
    )  # fmt: skip
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[vitals, Slow()])
    assert vitals.run is not None
    from harness.processes import run_series

    checked = run_series(module_server, vitals.run.id, "nonfinite/weights")["nonfinite/weights"]
    poisoned = [s for s, v in zip(checked["step"], checked["value"], strict=True) if v > 0]
    assert poisoned and min(poisoned) >= poison_at, checked
