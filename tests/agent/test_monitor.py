"""``Monitor`` for custom training loops: the same series as the callback from a real
TensorFlow loop, and how a loop that raises ends its run."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from harness.polling import wait_for
from harness.processes import ServerProcess, run_series
from tests.agent.peer import HOURLY_SENDS, running_peer
from trainvitals.protocol import END, POINTS

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import numpy as np  # noqa: E402

import trainvitals  # noqa: E402
from tests.agent.test_vitals import (  # noqa: E402
    BATCH,
    all_series,
    data,
    mlp,
)


def test_a_loop_that_raises_ends_its_run_with_the_traceback() -> None:
    with running_peer() as peer:
        server = peer.url.removesuffix("/api/v1/ingest").replace("ws://", "http://")
        with pytest.raises(ZeroDivisionError):
            with trainvitals.Monitor(server=server, run_name="boom", system_metrics=False) as mon:
                mon.log(1, metrics={"loss": 0.5})
                mon.log(2, metrics={"loss": 1 / 0})
        frames = peer.frames()
    points = [f for f in frames if f["type"] == POINTS]
    assert [v for f in points for v in f["series"]["loss"]["value"]] == [0.5]
    end = frames[-1]
    assert (end["type"], end["reason"]) == (END, "exception")
    assert "ZeroDivisionError" in end["traceback"]


def batch_step(model: Any, x: np.ndarray, y: np.ndarray, step: int) -> tuple[Any, Any, Any]:
    """Batch ``step``'s inputs, loss and gradients (mean squared error)."""
    xb, yb = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(yb, model(xb, training=True))
    return xb, loss, tape.gradient(loss, model.trainable_variables)


@pytest.mark.usefixtures("weights_checked_every_time")
def test_custom_loop_monitor_gives_the_same_series(server: ServerProcess) -> None:
    x, y = data()
    x[BATCH * 2 + 3, 1] = np.nan  # step 2 carries one NaN
    model = mlp()
    optimizer = keras.optimizers.SGD(0.01)
    with trainvitals.Monitor(
        server=server.url,
        run_name="custom",
        model=model,
        grad_norms_every=2,
        weights_every=3,
        system_metrics=0.1,
    ) as mon:
        for step in range(6):
            xb, loss, grads = batch_step(model, x, y, step)
            if step < 2:
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            metrics = {"acc": 0.5 + step / 100, "correct": tf.constant(4 * step, tf.int64)}
            mon.log(step, loss=loss, grads=grads, inputs=xb, metrics=metrics)
    series = all_series(server, mon.run.id)
    assert series["loss"]["step"] == list(range(6))
    assert series["nonfinite/inputs"]["value"] == [0, 0, 1, 0, 0, 0]
    assert series["nonfinite/loss"]["value"][2] == 1
    # Checked when the device ring is read (a few times a second and at the end), at most
    # once a read, under the last step due: 3 always, 0 if a read came between.
    checked = series["nonfinite/weights"]
    assert checked["step"] in ([3], [0, 3]) and set(checked["value"]) == {0}
    assert all(v > 0 for v in series["grad/global_norm"]["value"][:2])
    assert series["step_time"]["step"] == list(range(1, 6))
    assert series["acc"]["value"][0] == 0.5
    correct = series["correct"]  # a device value, fetched with the ring's rows
    assert (correct["step"], correct["value"]) == (list(range(6)), [0, 4, 8, 12, 16, 20])
    per_variable = {name for name in series if name.startswith("grad/norm/")}
    assert per_variable == {f"grad/norm/{v.path}" for v in model.trainable_variables}
    assert {"host/rss", "host/limit"} <= set(series)
    assert server.get(f"/api/v1/runs/{mon.run.id}")["status"] == "finished"


def test_the_weights_check_is_made_on_the_training_thread_at_the_first_log(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its trace and first run (tens of ms) come with the loop's first log, not at the
    sender's first hand-over in the middle of training; once, and not without a model."""
    from trainvitals.agent import tf_vitals

    made: list[str] = []
    create = tf_vitals.WeightsCheck.create

    def recorded(model: Any) -> Any:
        made.append(threading.current_thread().name)
        return create(model)

    monkeypatch.setattr(tf_vitals.WeightsCheck, "create", staticmethod(recorded))
    x, y = data()
    model = mlp()
    with trainvitals.Monitor(
        server=server.url, run_name="weights", model=model, weights_every=3, system_metrics=False
    ) as mon:
        assert made == []
        for step in range(4):
            xb, loss, grads = batch_step(model, x, y, step)
            mon.log(step, loss=loss, grads=grads, inputs=xb)
            assert made == [threading.current_thread().name]
        check = mon._recorder.weights
        assert check is not None and check._count.experimental_get_tracing_count() == 1
    with trainvitals.Monitor(server=server.url, run_name="no-model", system_metrics=False) as mon:
        mon.log(0, loss=0.5)
    assert len(made) == 1


class CountingMonitor(trainvitals.Monitor):
    """Counts the sender's looks at the ring and its hand-overs of read rows to the run."""

    looks = hand_overs = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        hand_over = self._recorder.hand_over

        def counted(ring: Any, measured: Any) -> None:
            if threading.current_thread().name == "trainvitals-sender":
                self.hand_overs += 1
            hand_over(ring, measured)

        self._recorder.hand_over = counted  # type: ignore[method-assign]

    def _look(self) -> None:
        if self._writer is not None and self._writer.ring is not None:
            self.looks += 1
        super()._look()


def test_monitor_keeps_healthy_rows_until_a_send_and_sends_a_nan_at_the_next_look(
    server: ServerProcess,
) -> None:
    """With an hour between sends, the rows a look reads wait on the host; a NaN/Inf among
    them goes at that look, with the steps before it, while the loop still runs."""
    x, y = data()
    x[BATCH * 3 + 1, 2] = np.nan  # step 3 carries one NaN
    model = mlp()
    mon = CountingMonitor(server=server.url, run_name="looks", **HOURLY_SENDS)
    with mon:

        def sent(name: str) -> list[int]:
            return list(run_series(server, mon.run.id, name).get(name, {}).get("step", []))

        for step in range(4):
            xb, loss, grads = batch_step(model, x, y, step)
            mon.log(step, loss=loss, grads=grads, inputs=xb)
        wait_for(lambda: 3 in sent("nonfinite/inputs"), what="the NaN step, at a look")
        assert sent("loss") == [0, 1, 2, 3]
        for step in range(4, 6):  # healthy again (the loop never applied its gradients)
            xb, loss, grads = batch_step(model, x, y, step)
            mon.log(step, loss=loss, grads=grads, inputs=xb)
        handed, looked = mon.hand_overs, mon.looks
        wait_for(lambda: mon.looks >= looked + 5, what="five more looks")
        assert mon.hand_overs == handed and sent("loss") == [0, 1, 2, 3]  # they wait
    assert sent("loss") == list(range(6))  # the end hands everything over


def test_the_optimizers_learning_rate_is_recorded_with_each_step(server: ServerProcess) -> None:
    x, y = data()
    model = mlp()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=1, decay_rate=0.5)
    optimizer = keras.optimizers.SGD(schedule)
    with trainvitals.Monitor(
        server=server.url, run_name="lr", optimizer=optimizer, system_metrics=False
    ) as mon:
        for step in range(4):
            _, loss, grads = batch_step(model, x, y, step)
            mon.log(step, loss=loss, grads=grads)  # before the update: this step's rate
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        mon.log(4, metrics={"acc": 1.0})  # no tensors: nothing is read from the optimizer
    lr = all_series(server, mon.run.id)["lr"]
    assert lr["step"] == [0, 1, 2, 3]
    np.testing.assert_allclose(lr["value"], [0.01, 0.005, 0.0025, 0.00125], rtol=1e-6)


def test_a_variable_logged_as_a_metric_is_recorded_as_it_was_at_the_log(
    server: ServerProcess,
) -> None:
    """A device value waits for the ring's read to be converted; a variable (a counter, the
    optimizer's iterations) was read then, five times its last value."""
    counter = tf.Variable(0.0)
    iterations = keras.Variable(0, dtype="int64")
    with trainvitals.Monitor(server=server.url, run_name="vars", system_metrics=False) as mon:
        for step in range(5):
            counter.assign_add(1.0)
            iterations.assign(iterations + 10)
            mon.log(step, loss=tf.constant(1.0), metrics={"counter": counter, "it": iterations})
    series = all_series(server, mon.run.id)
    assert series["counter"]["value"] == [1, 2, 3, 4, 5]
    assert series["it"]["value"] == [10, 20, 30, 40, 50]


def test_gradients_every_few_steps_trace_one_writer_per_layout(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop that passes gradients every third step (a GAN's critic, accumulation) switched
    between two layouts of log()'s arguments, and each switch made a new writer: a new trace
    (some 100 ms), a new ring, and TensorFlow's retracing warning in the user's log."""
    x, y = data()
    model = mlp()
    with (
        caplog.at_level(logging.WARNING),
        trainvitals.Monitor(server=server.url, run_name="every third", system_metrics=False) as mon,
    ):
        for step in range(18):
            xb, loss, grads = batch_step(model, x, y, step % 6)
            mon.log(step, loss=loss, grads=grads if step % 3 == 0 else None, inputs=xb)
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
    writers = [writer for writer, _ in mon._writers.values()]
    # Each traced as a first call does, twice (making its ring, then without), and never again.
    assert [w._write.experimental_get_tracing_count() for w in writers] == [2, 2]
    series = all_series(server, mon.run.id)
    assert series["loss"]["step"] == list(range(18))
    assert series["grad/global_norm"]["step"] == list(range(0, 18, 3))
    assert series["nonfinite/inputs"]["step"] == list(range(18))
