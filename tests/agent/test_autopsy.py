"""NaN autopsy and the agent's protective actions, on real Keras training."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import trainvitals  # noqa: E402
from harness.processes import ServerProcess, wait_for  # noqa: E402
from trainvitals.agent import autopsy  # noqa: E402
from trainvitals.agent.gpu import SimulatedGpu  # noqa: E402
from trainvitals.detect.settings import OomForecast  # noqa: E402

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


def nan_in_batch(step: int | None, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Regression data whose batch number ``step`` (1-based) carries 3 NaN (None: clean)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(steps * BATCH, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32")).reshape(-1, 1)
    if step is not None:
        x[(step - 1) * BATCH, :3] = np.nan
    return x, y


def small_model() -> Any:
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def test_fit_stops_at_the_nan_batch_and_hands_back_the_last_finite_weights(
    server: ServerProcess, tmp_path: Path
) -> None:
    x, y = nan_in_batch(step=47, steps=60)
    model = small_model()
    rescue = tmp_path / "rescue.weights.h5"
    vitals = trainvitals.VitalsCallback(
        server=server.url,
        run_name="rescue",
        system_metrics=False,
        watchdog=False,
        protect=trainvitals.Protection(str(rescue), good_every=20),
    )
    history = model.fit(
        x, y, batch_size=BATCH, epochs=1, shuffle=False, callbacks=[vitals], verbose=0
    )
    assert vitals.run is not None and vitals.guard is not None
    assert vitals.guard.good_step == 40
    assert vitals.run.last_step < 60  # stopped early ...
    assert history.history  # ... and fit returned normally
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())  # not the poisoned ones
    saved = small_model()
    saved.load_weights(rescue)
    assert all(
        np.array_equal(a, b) for a, b in zip(saved.get_weights(), model.get_weights(), strict=True)
    )

    def nonfinite_alert() -> dict[str, Any] | None:
        alerts = server.get(f"/api/v1/runs/{vitals.run.id}/alerts")["alerts"]  # type: ignore[union-attr]
        found = [a for a in alerts if a["rule"] == "nonfinite" and "autopsy" in a["evidence"]]
        return found[0] if found else None

    alert = wait_for(nonfinite_alert, what="the nonfinite alert with its autopsy")
    report = alert["evidence"]["autopsy"]
    assert (report["step"], report["origin"], report["method"]) == (47, "inputs", "vitals")
    assert "step 40 will be restored" in report["action"]
    assert alert["step"] == 47
    events = server.get(f"/api/v1/runs/{vitals.run.id}")["events"]
    assert [(e["kind"], e["step"]) for e in events] == [("autopsy", 47)]


def test_a_memory_forecast_saves_the_weights_and_stops_before_the_oom(
    server: ServerProcess, tmp_path: Path
) -> None:
    x, y = nan_in_batch(step=None, steps=40)
    model = small_model()
    checkpoint = tmp_path / "before-oom.weights.h5"
    protection = trainvitals.Protection(
        str(checkpoint),
        on_oom="stop",
        oom_eta=300,
        # The simulated leak fills the card in ~10 s; the forecast may decide after 1 s.
        forecast=OomForecast(min_span=1.0, min_points=5, every=0.2),
    )
    gpu = SimulatedGpu(mem_total=16e9, mem_start=2e9, mem_growth=5e7)
    pace = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.01))
    vitals = trainvitals.VitalsCallback(
        server=server.url,
        run_name="oom",
        system_metrics=0.05,
        gpu=gpu,
        watchdog=False,
        protect=protection,
    )
    model.fit(
        x, y, batch_size=BATCH, epochs=100, shuffle=False, callbacks=[vitals, pace], verbose=0
    )
    assert vitals.run is not None and vitals.guard is not None
    assert vitals.run.last_step < 100 * 40  # stopped well before the end
    assert checkpoint.exists()
    assert vitals.guard.oom_eta is not None and vitals.guard.oom_eta <= 300
    assert any("training stopped" in action for action in vitals.guard.actions)


def test_monitor_replays_the_bad_batch_of_a_custom_loop(server: ServerProcess) -> None:
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
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    run_id = mon.run.id

    def autopsy_report() -> dict[str, Any] | None:
        events = server.get(f"/api/v1/runs/{run_id}")["events"]
        return events[0]["data"] if events else None

    report = wait_for(autopsy_report, what="the autopsy event")
    assert (report["method"], report["origin"], report["layer"]) == ("replay", "layer", "exp")
    assert report["layers"][1]["nonfinite"] > 0 and report["layers"][0]["nonfinite"] == 0
