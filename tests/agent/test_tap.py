"""The tapped train step across fits: a loop of fits with one callback traces it once.

Each trace of a train step costs TensorFlow memory it never gives back (some 3.7 MiB for a
small dense model) and a good part of a second; the callback used to trace a tapped step at
every fit. These are real fits against a real server; the traces are counted where Python
runs only while TensorFlow traces: in the model's ``train_step``.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import trainvitals  # noqa: E402
from harness.processes import ServerProcess, run_series  # noqa: E402
from tests.agent.test_keras_callback import small_model  # noqa: E402
from trainvitals.agent.host import process_memory  # noqa: E402
from trainvitals.series import GRAD_GLOBAL_NORM  # noqa: E402

BATCH, SAMPLES = 16, 96  # 6 steps an epoch


class Counted(keras.Sequential):  # type: ignore[misc,name-defined]
    """Counts the traces of its train step."""

    traces = 0

    def train_step(self, data: Any) -> Any:
        self.traces += 1
        return super().train_step(data)


def counted_model(learning_rate: float = 0.01, steps_per_execution: int = 1) -> Counted:
    model: Counted = small_model(learning_rate, steps_per_execution, kind=Counted)
    return model


def regression_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def callback(server: ServerProcess, name: str, **kwargs: Any) -> trainvitals.VitalsCallback:
    return trainvitals.VitalsCallback(
        server=server.url, run_name=name, system_metrics=False, watchdog=False, **kwargs
    )


def fit(model: Any, *callbacks: Any, epochs: int = 1, data: Any = None) -> Any:
    x, y = regression_data() if data is None else data
    return model.fit(
        x, y, batch_size=BATCH, epochs=epochs, verbose=0, shuffle=False, callbacks=list(callbacks)
    )


def rss_mib() -> float:
    gc.collect()
    memory = process_memory()
    assert memory is not None
    return memory["rss"] / 2**20


def assert_run_has_its_own_steps(server: ServerProcess, vitals: Any, steps: int) -> None:
    assert vitals.run is not None
    series = run_series(server, vitals.run.id, "loss", "mae", GRAD_GLOBAL_NORM, "lr")
    for name in ("loss", "mae", GRAD_GLOBAL_NORM, "lr"):
        assert series[name]["step"] == list(range(1, steps + 1)), (name, series[name]["step"])
    assert all(np.isfinite(series[GRAD_GLOBAL_NORM]["value"]))


def test_a_loop_of_fits_traces_the_tapped_step_once_and_its_memory_stays_flat(
    server: ServerProcess, tmp_path: Path
) -> None:
    """30 fits with one callback: one trace for the loop, no memory that grows fit after
    fit, each fit's run with exactly its own steps, and the model saved between fits as a
    bare one is; then a fit without the callback runs the model's own step."""
    model = counted_model()
    vitals = callback(server, "loop")
    fit(model, vitals)
    tap, plain = vitals._tap, model.train_function
    traced = model.traces
    assert traced > 0 and tap is not None and tap.ring is not None
    assert "train_step" not in vars(model)  # the model's own between fits
    rss: list[float] = []
    for turn in range(2, 31):
        fit(model, vitals)
        if turn == 5:
            rss.append(rss_mib())
            model.save(tmp_path / "between.keras")
            saved = model.get_weights()
        assert vitals._tap is tap and model.train_function is plain
        assert_run_has_its_own_steps(server, vitals, 6)
    rss.append(rss_mib())
    assert model.traces == traced, "the tapped step was traced again in the loop"
    # A trace per fit kept about 3.7 MiB each: 90 MiB over these 25 fits.
    assert rss[-1] - rss[0] < 20, rss
    assert tap.ring.lost == 0
    loaded = keras.models.load_model(
        tmp_path / "between.keras", custom_objects={"Counted": Counted}
    )
    assert len(loaded.get_weights()) == len(saved) == 4
    assert all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), saved, strict=True))
    assert not [v for v in model.variables if "trainvitals" in v.path]
    # Without the callback: the model's own step, never the tap's (no row written).
    written = tap.ring.written()
    history = fit(model)
    assert set(history.history) == {"loss", "mae"}
    x, y = regression_data()
    model.train_on_batch(x[:BATCH], y[:BATCH])
    assert tap.ring.written() == written and model.train_function is plain
    assert not {"train_step", "compute_loss", "make_train_function"} & set(vars(model))
    assert "apply" not in vars(model.optimizer)


def test_a_recompile_or_a_new_steps_per_execution_traces_a_new_tapped_step(
    server: ServerProcess,
) -> None:
    """What the trace captured: a new optimizer (a recompile, where Keras drops its own
    train function too) or another ``steps_per_execution``: a step of its own, whose run
    numbers its steps right and records the new optimizer's rate."""
    model = counted_model(learning_rate=0.01)
    vitals = callback(server, "recompiled")
    fit(model, vitals)
    first = vitals._tap
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    traced = model.traces
    fit(model, vitals)
    assert model.traces > traced and vitals._tap is not first
    assert vitals.run is not None
    lr = run_series(server, vitals.run.id, "lr")["lr"]
    assert lr["step"] == list(range(1, 7)) and lr["value"] == pytest.approx([0.1] * 6)
    second, traced = vitals._tap, model.traces
    model.steps_per_execution = 4  # no recompile: Keras keeps its own function then
    fit(model, vitals, epochs=2)
    assert model.traces > traced and vitals._tap is not second
    assert vitals._tap is not None and vitals._tap.ring is not None
    assert vitals._tap.ring.capacity == max(1024, 8)
    assert_run_has_its_own_steps(server, vitals, 12)
    traced = model.traces
    fit(model, vitals, epochs=2)  # the same settings again: the same step
    assert model.traces == traced
    assert_run_has_its_own_steps(server, vitals, 12)


def test_another_callbacks_fit_between_two_fits_leaves_each_its_own_step(
    server: ServerProcess,
) -> None:
    """A, then B, then A: B's fit taps a step of its own; A's next fit takes its own back
    untraced, and neither run holds the other's rows."""
    model = counted_model()
    first, other = callback(server, "first"), callback(server, "other")
    fit(model, first)
    fit(model, other)
    assert_run_has_its_own_steps(server, other, 6)
    traced = model.traces
    fit(model, first, epochs=2)
    assert model.traces == traced
    assert_run_has_its_own_steps(server, first, 12)
    assert first._tap is not None and first._tap.ring is not None
    assert first._tap.ring.written() == 12


def test_a_fit_left_by_an_exception_then_a_fit_with_the_callback_reuses_the_step(
    server: ServerProcess,
) -> None:
    """The left fit's tap stays on the model until the next fit asks for its train function:
    one with the same callback resumes it, untraced, and counts its own steps from 1; the
    row the left fit wrote after its last hook is read into neither run."""

    class Fails(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if batch == 2:
                raise RuntimeError("out of memory, say")

    model = counted_model()
    vitals = callback(server, "left")
    with pytest.raises(RuntimeError):
        fit(model, Fails(), vitals, epochs=2)
    assert vitals.run is not None
    left, traced = vitals.run.id, model.traces
    fit(model, vitals)
    assert model.traces == traced and vitals.run.id != left
    assert_run_has_its_own_steps(server, vitals, 6)
    assert run_series(server, left, "loss")["loss"]["step"] == [1, 2]
    assert not {"train_step", "compute_loss", "_trainvitals_tap"} & set(vars(model))


def test_each_fit_of_a_loop_keeps_its_own_bad_step(server: ServerProcess) -> None:
    """With ``protect=``, a NaN batch in the second fit of a loop: that fit stops at its own
    step, and the batch kept for the autopsy is its own, not a leftover of the first."""
    model = counted_model()
    vitals = callback(server, "protected", protect=trainvitals.Protection())
    fit(model, vitals)
    assert vitals._tap is not None and vitals._tap.bad_step is not None
    assert vitals._tap.bad_step.take() is None
    traced = model.traces
    x, y = regression_data()
    x[2 * BATCH + 1, 0] = np.nan  # the third step's batch
    fit(model, vitals, data=(x, y))
    assert model.traces == traced
    assert vitals.run is not None
    inputs = run_series(server, vitals.run.id, "nonfinite/inputs")["nonfinite/inputs"]
    assert inputs["step"] == [1, 2, 3] and inputs["value"][2] > 0 and inputs["value"][:2] == [0, 0]
    kept = vitals._tap.bad_step.take()
    assert kept is not None and np.isnan(kept.data[0]).sum() == 1
    assert np.all(np.isfinite(model.get_weights()[0]))  # the weights of before it, restored
    fit(model, vitals)
    assert vitals._tap.bad_step.take() is None  # the next fit keeps its own, if any
    assert_run_has_its_own_steps(server, vitals, 6)
