"""NaN autopsy: where the first NaN/Inf came from, on real Keras training and a custom loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import trainvitals  # noqa: E402
from harness.polling import wait_for  # noqa: E402
from harness.processes import ServerProcess  # noqa: E402
from trainvitals.agent import autopsy  # noqa: E402

BATCH = 16


def overflow_model() -> Any:
    """Dense -> exp -> Dense: a large enough input overflows at the exp layer."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="dense"),
            keras.layers.Activation("exponential", name="exp"),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def batch(scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.normal(size=(BATCH, 4)) * scale).astype("float32"), np.ones((BATCH, 1), "float32")


def test_replay_names_the_layer_that_overflowed() -> None:
    model = overflow_model()
    x, y = batch(scale=1e4)
    report = autopsy.replay(model, x, y)
    assert (report["origin"], report["layer"]) == ("layer", "exp")
    assert [row["layer"] for row in report["layers"]] == ["dense", "exp", "head"]
    assert report["layers"][0]["nonfinite"] == 0
    assert "'exp'" in report["verdict"]


def test_replay_blames_a_bad_batch_and_poisoned_weights() -> None:
    model = overflow_model()
    x, y = batch()
    x[3, 1] = np.nan
    assert autopsy.replay(model, x, y)["origin"] == "inputs"
    x, y = batch()
    kernel = model.get_layer("head").kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    report = autopsy.replay(model, x, y)
    assert (report["origin"], report["layer"]) == ("weights", "head")
    assert report["weights_nonfinite"] == {"head": 8}


def test_replay_of_a_clean_batch_points_at_the_backward_pass() -> None:
    model = overflow_model()
    x, y = batch()
    assert autopsy.replay(model, x, y)["origin"] == "backward"


def overflow_loop(server: ServerProcess, stop_at_nan: bool) -> dict[str, Any]:
    """A custom loop whose step 25 overflows in the ``exp`` layer; the run's autopsy report.
    ``stop_at_nan``: the loop checks its loss and stops before applying that step."""
    model = overflow_model()
    optimizer = keras.optimizers.SGD(1e-3)
    with trainvitals.Monitor(
        server=server.url, run_name="loop", model=model, system_metrics=False, watchdog=False
    ) as mon:
        for step in range(1, 31):
            x, y = batch(scale=1e4 if step == 25 else 1.0)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            mon.log(step, loss=loss, grads=grads, inputs=x)  # before the update, as documented
            if stop_at_nan and not np.isfinite(float(loss)):
                break
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    run_id = mon.run.id

    def autopsy_event() -> dict[str, Any] | None:
        events = server.get(f"/api/v1/runs/{run_id}")["events"]
        return events[0] if events else None

    event: dict[str, Any] = wait_for(autopsy_event, what="the autopsy event")
    assert event["step"] == 25, event
    report: dict[str, Any] = event["data"]
    return report


def test_monitor_replays_the_bad_batch_of_a_loop_that_stops_there(server: ServerProcess) -> None:
    report = overflow_loop(server, stop_at_nan=True)
    assert (report["method"], report["origin"], report["layer"]) == ("replay", "layer", "exp")
    assert report["layers"][1]["nonfinite"] > 0 and report["layers"][0]["nonfinite"] == 0


def test_a_loop_that_went_on_gets_the_autopsy_from_its_vitals(server: ServerProcess) -> None:
    """The NaN/Inf step is seen after the loop applied it (no fetch per step): replaying its
    batch on poisoned weights would blame the weights, so the vitals speak instead."""
    report = overflow_loop(server, stop_at_nan=False)
    assert report["method"] == "vitals"
    assert report["origin"] != "weights", report
