"""The agent's protective actions, on real Keras training: stop at a NaN batch with the last
finite weights, save and stop before a forecast OOM."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import trainvitals  # noqa: E402
from harness.polling import wait_for  # noqa: E402
from harness.processes import ServerProcess  # noqa: E402
from trainvitals.agent.gpu import SimulatedGpu  # noqa: E402
from trainvitals.detect.settings import OomForecast  # noqa: E402

BATCH = 16


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
    # stopped at the NaN batch itself (its flag rides in the logs under protect=) ...
    assert vitals.run.last_step == 47
    assert history.history  # ... and fit returned normally, its records without the flag
    assert set(history.history) == {"loss"}
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
    # The bad step's batch was kept on that step: the autopsy replays it.
    assert (report["step"], report["cause"], report["method"]) == (47, "inputs", "replay")
    assert "step 40 will be restored" in report["action"]
    assert alert["step"] == 47
    events = server.get(f"/api/v1/runs/{vitals.run.id}")["events"]
    assert [(e["kind"], e["step"]) for e in events] == [("autopsy", 47)]


def test_a_nan_before_the_first_copy_hands_back_the_weights_fit_began_with(
    server: ServerProcess,
) -> None:
    """The copies come every ``good_every`` steps (100 by default): a NaN at step 5 had none
    to restore, and left the model's weights poisoned. The weights fit starts from are one."""
    x, y = nan_in_batch(step=5, steps=10)
    model = small_model()
    began = model.get_weights()
    vitals = trainvitals.VitalsCallback(
        server=server.url, run_name="early nan", system_metrics=False, watchdog=False,
        protect=trainvitals.Protection(),
    )  # fmt: skip
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, callbacks=[vitals], verbose=0)
    assert vitals.run is not None and vitals.guard is not None
    assert (vitals.run.last_step, vitals.guard.good_step) == (5, 0)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), began, strict=True))


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
