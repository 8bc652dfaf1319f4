"""Per-step and per-second vitals from real training: ``fit`` and a custom loop."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import trainvitals  # noqa: E402
from harness.polling import wait_for  # noqa: E402
from harness.processes import ServerProcess, run_series  # noqa: E402
from trainvitals.agent import tf_vitals  # noqa: E402
from trainvitals.agent.gpu import (  # noqa: E402
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    NvmlSource,
    SimulatedGpu,
)

BATCH = 16


def data(samples: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(samples, 6)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.3).astype("float32")


def mlp(second_activation: str = "relu", **first_layer: Any) -> Any:
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(12, activation="tanh", name="first", **first_layer),
            keras.layers.Dense(8, activation=second_activation, name="second"),
            keras.layers.Dense(1, name="out"),
        ],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def all_series(server: ServerProcess, run_id: str) -> dict[str, Any]:
    series: dict[str, Any] = server.get(f"/api/v1/runs/{run_id}/series?max_points=100000")
    return series["series"]  # type: ignore[no-any-return]


def test_an_embeddings_gradient_norm_adds_the_rows_of_an_id_looked_up_twice(
    server: ServerProcess,
) -> None:
    """An embedding's gradient comes as ``IndexedSlices``, a row per lookup; the optimizer adds
    the rows of one id up. Squared one by one, 32 lookups of one id gave 0.75 for a gradient
    whose norm is 1.66, and the global norm with it."""
    x = np.array([[1, 1, 1, 1]] * 8 + [[2, 3, 2, 3]] * 8, dtype="int32")
    y = np.linspace(0.0, 1.0, 16, dtype="float32").reshape(-1, 1)

    def embedding_model() -> Any:
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(10, 3, name="emb"),
                keras.layers.Flatten(),
                keras.layers.Dense(1, name="out"),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = embedding_model()
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    assert isinstance(grads[0], tf.IndexedSlices)
    true = [float(tf.norm(tf.convert_to_tensor(g))) for g in grads]  # the rows added up
    squares = tf_vitals.squared_norms(grads).numpy()
    assert np.allclose(np.sqrt(squares), true, rtol=1e-5)

    model = embedding_model()
    vitals = trainvitals.VitalsCallback(
        server=server.url, run_name="embedding", grad_norms_every=1, system_metrics=False
    )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    series = all_series(server, vitals.run.id)
    (embedding,) = [n for n in series if n.startswith("grad/norm/") and "emb" in n]
    assert series[embedding]["value"][0] == pytest.approx(true[0], rel=1e-5)
    assert series["grad/global_norm"]["value"][0] == pytest.approx(
        math.sqrt(sum(t * t for t in true)), rel=1e-5
    )


@pytest.mark.usefixtures("weights_checked_every_time")
def test_healthy_fit_reports_every_vital(server: ServerProcess) -> None:
    x, y = data()
    model = mlp()
    vitals = trainvitals.VitalsCallback(
        server=server.url,
        run_name="healthy",
        grad_norms_every=5,
        weights_every=6,
        system_metrics=0.1,
    )
    model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    series = all_series(server, vitals.run.id)
    steps = list(range(1, 19))
    norm = series["grad/global_norm"]
    assert norm["step"] == steps and all(math.isfinite(v) and v > 0 for v in norm["value"])
    for name in ("nonfinite/loss", "nonfinite/inputs", "nonfinite/grads"):
        assert series[name]["step"] == steps and set(series[name]["value"]) == {0}, name
    # Filed at the step the weights were read at: the multiple of 6 that made it due, or later.
    checked = series["nonfinite/weights"]["step"]
    assert len(checked) == 3 and all(a >= b for a, b in zip(checked, [6, 12, 18], strict=True))
    assert checked == sorted(set(checked)) and checked[-1] <= 18
    assert set(series["nonfinite/weights"]["value"]) == {0}
    per_variable = {name for name in series if name.startswith("grad/norm/")}
    assert per_variable == {f"grad/norm/{v.path}" for v in model.trainable_variables}
    assert series["grad/norm/net/first/kernel"]["step"] == [5, 10, 15]
    # The per-variable norms are the pieces of the global norm.
    at_5 = [series[name]["value"][0] for name in per_variable]
    assert math.isclose(math.sqrt(sum(v * v for v in at_5)), norm["value"][4], rel_tol=1e-4)
    assert len(series["step_time"]["step"]) >= 15 and min(series["step_time"]["value"]) > 0
    rss, limit = series["host/rss"]["value"], series["host/limit"]["value"]
    assert rss and all(0 < r < limit[0] for r in rss)
    env = server.get(f"/api/v1/runs/{vitals.run.id}")["env"]
    assert env["tensorflow"] == tf.__version__ and env["distribution_strategy"]
    assert "mixed_precision_policy" in env and "tf_build" in env
    # The model order of the per-variable norms, which storage gives back alphabetically.
    assert env["variable_order"] == [v.path for v in model.trainable_variables]
    assert "loss_at_chance" not in env  # a regression: its level comes step by step...
    # ...measured on each batch's targets: an epoch's batches hold every sample once, so
    # their mean is the whole data's mean square, plus the one of guessing 1 and -1.
    chance = series["loss_at_chance"]
    assert chance["step"] == steps
    assert np.mean(chance["value"][:6]) == pytest.approx(float(np.mean(y**2)) + 1, rel=1e-5)


def nan_batch_run(
    server: ServerProcess, name: str, *names: str, jit_compile: bool = False
) -> dict[str, Any]:
    """The series of a 6-step ``fit`` whose third batch carries k = 3 NaN/Inf."""
    x, y = data()
    x[2 * BATCH + 1, 0] = x[2 * BATCH + 9, 2] = np.nan
    x[2 * BATCH + 5, 3] = np.inf
    model = mlp(second_activation="tanh")  # lets the NaN through to the loss (see below)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=jit_compile)
    vitals = trainvitals.VitalsCallback(server=server.url, run_name=name, system_metrics=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    counts = ("nonfinite/inputs", "nonfinite/loss", "nonfinite/grads", "grad/global_norm")
    return run_series(server, vitals.run.id, *counts, *names)


def assert_third_step_counted(series: dict[str, Any]) -> None:
    """The NaN/Inf of :func:`nan_batch_run`'s third batch, counted at that very step."""
    assert series["nonfinite/inputs"]["value"] == [0, 0, 3, 0, 0, 0]
    assert series["nonfinite/loss"]["value"][:3] == [0, 0, 1]
    assert series["nonfinite/grads"]["value"][:2] == [0, 0]
    assert series["nonfinite/grads"]["value"][2] > 0


def test_nan_in_one_input_batch_is_counted_at_that_step(server: ServerProcess) -> None:
    series = nan_batch_run(server, "nan-input", "grad/norm/net/first/kernel")
    assert_third_step_counted(series)
    # Non-finite gradients record the per-variable norms at that very step.
    assert 3 in series["grad/norm/net/first/kernel"]["step"]


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_vitals_under_xla_and_mixed_precision(server: ServerProcess, policy: str) -> None:
    # On a machine with a GPU, Keras compiles the train step with XLA by default
    # (jit_compile="auto"), so that is the path most fit runs take; mixed precision wraps the
    # optimizer in a LossScaleOptimizer, whose scaled gradients must not reach the norms.
    reference = nan_batch_run(server, "reference")
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        series = nan_batch_run(server, f"xla-{policy}", jit_compile=True)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert_third_step_counted(series)
    # The first two steps' norms are the float32 run's, not multiplied by the loss scale.
    for got, want in zip(
        series["grad/global_norm"]["value"][:2],
        reference["grad/global_norm"]["value"][:2],
        strict=True,
    ):
        assert math.isclose(got, want, rel_tol=1e-2), (got, want)
    if policy == "mixed_float16":
        # The loss scale skips the bad step's update, so training goes on with finite values.
        assert series["nonfinite/grads"]["value"][3:] == [0, 0, 0]
        assert all(math.isfinite(v) for v in series["grad/global_norm"]["value"][3:])


def test_nan_input_that_the_forward_pass_hides_is_counted_through_the_gradients(
    server: ServerProcess,
) -> None:
    """A healthy step does not read the inputs (docs/vitals.md): a NaN among them shows in the
    first layer's kernel gradient even where the forward pass drops it, and the exact counts
    then name the inputs."""
    x, y = data()
    x[BATCH + 2, 0] = np.nan
    keras.utils.set_random_seed(5)
    # After the first layer the model replaces NaN by 0, so the loss stays finite; that
    # layer's kernel gradient still multiplies the NaN input (by a zero upstream gradient).
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            keras.layers.Lambda(lambda t: keras.ops.nan_to_num(t, nan=0.0)),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    vitals = trainvitals.VitalsCallback(server=server.url, run_name="hidden", system_metrics=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    names = ("nonfinite/inputs", "nonfinite/loss", "nonfinite/grads")
    series = run_series(server, vitals.run.id, *names)
    inputs, loss, grads = (series[name]["value"] for name in names)
    assert inputs == [0, 1, 0, 0, 0, 0]
    assert loss[:2] == [0, 0] and grads[0] == 0 and grads[1] > 0


def test_per_variable_norms_name_the_layer_that_blew_up(server: ServerProcess) -> None:
    x, y = data()
    # "first" has its weights scaled up ten-thousandfold; its L2 penalty's gradient (2·λ·W)
    # explodes with them, while tanh saturation keeps the other layers' inputs bounded.
    model = mlp(kernel_regularizer=keras.regularizers.L2(1e-2))
    kernel = model.get_layer("first").kernel
    kernel.assign(kernel.numpy() * 1e4)
    vitals = trainvitals.VitalsCallback(
        server=server.url, run_name="blowup", grad_norms_every=1, system_metrics=False
    )
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    series = all_series(server, vitals.run.id)
    norms = {
        name.removeprefix("grad/norm/"): s["value"][0]
        for name, s in series.items()
        if name.startswith("grad/norm/")
    }
    ranked = sorted(norms, key=norms.__getitem__, reverse=True)
    assert ranked[0] == "net/first/kernel"
    assert norms[ranked[0]] > 100 * norms[ranked[1]]


@pytest.mark.usefixtures("weights_checked_every_time")
def test_simulated_gpu_values_arrive_as_gpu_series(server: ServerProcess) -> None:
    gpu = SimulatedGpu(
        mem_total=16e9, mem_start=1e9, mem_growth=5e8, temp_start=60, temp_rise=2, throttle_from=3
    )
    mon = trainvitals.Monitor(server=server.url, run_name="gpu", gpu=gpu, system_metrics=0.02)
    mon.log(1, metrics={"loss": 1.0})
    wait_for(lambda: gpu.ticks >= 6, timeout=30, what="six GPU samples")
    assert mon.finish()
    series = all_series(server, mon.run.id)
    used = series["gpu0/mem_used"]["value"]
    assert used[:4] == [1e9, 1.5e9, 2e9, 2.5e9] and series["gpu0/mem_total"]["value"][0] == 16e9
    assert series["gpu0/temp"]["value"][:4] == [60, 62, 64, 66]
    assert series["gpu0/tf_current"]["value"][:2] == [1e9, 1.5e9]
    throttle = series["gpu0/throttle"]["value"]
    assert throttle[:3] == [0, 0, 0]
    assert throttle[3] == THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL
    for name in ("gpu0/util", "gpu0/power", "gpu0/clock_sm"):
        assert series[name]["value"]
    env = server.get(f"/api/v1/runs/{mon.run.id}")["env"]
    assert env["simulated_gpu"]["gpus"][0]["name"] == "Simulated GPU"


def test_without_nvml_there_are_no_gpu_series_and_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="trainvitals"):
        source = NvmlSource.create()
    if source is not None:
        pytest.skip("this machine has a GPU with NVML: the real path runs instead")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("trainvitals: no GPU series")


def test_weights_check_counts_nan_in_weights_that_do_not_train() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
    check = tf_vitals.WeightsCheck(model)
    assert check() == 0
    moving_variance = next(w for w in model.weights if "moving_variance" in w.path)
    moving_variance.assign([np.nan, 1.0, np.inf, 1.0])  # loss in training mode stays finite
    assert check() == 2


def test_many_weights_checks_do_not_warn_of_retracing(caplog: pytest.LogCaptureFixture) -> None:
    # A hyper-parameter loop makes a model and a callback per trial: each check traces once.
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for width in range(1, 13):
            model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width)])
            assert tf_vitals.WeightsCheck(model)() == 0
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_the_callbacks_weights_check_is_traced_before_training_and_never_again() -> None:
    """The trace (tens of ms) happens as the check is made, in on_train_begin, not at the
    first check on the sender thread in the middle of training."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    check = tf_vitals.WeightsCheck.create(model)
    assert check is not None
    assert check._count.experimental_get_tracing_count() == 1
    assert check() == 0 and check() == 0
    assert check._count.experimental_get_tracing_count() == 1


def test_weights_check_keeps_to_its_interval() -> None:
    clock = [100.0]
    check = tf_vitals.WeightsCheck(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    check.clock = lambda: clock[0]
    assert check.due()
    clock[0] += 0.5
    assert not check.due()
    clock[0] += 0.6
    assert check.due()


def compiled_vitals_step() -> Any:
    """A compiled step of a one-kernel model returning its packed vitals, its batch a (4, 3)."""
    kernel = tf.Variable(np.ones((3, 2), np.float32))

    @tf.function  # type: ignore[untyped-decorator]
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, kernel)))
        grads = tape.gradient(loss, [kernel])
        return tf_vitals.step_vitals(loss, {"x": x}, grads)

    return step


def test_with_a_gpu_the_counts_run_every_step_without_a_conditional(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a GPU an If's predicate is read on the host, a wait for the device every step.
    monkeypatch.setattr(tf_vitals, "has_gpu", lambda: True)
    step = compiled_vitals_step()
    assert step(tf.ones((4, 3))).numpy()[1:4].tolist() == [0, 0, 0]
    x = np.ones((4, 3), np.float32)
    x[0, 0], x[2, 1] = np.nan, np.inf
    assert step(tf.constant(x)).numpy()[1:4].tolist() == [1, 2, 6]
    graph = step.get_concrete_function(tf.TensorSpec((4, 3), tf.float32)).graph
    kinds = {op.type for op in graph.get_operations()}
    assert not kinds & {"If", "StatelessIf", "Switch", "Merge"}, kinds


def test_step_vitals_in_a_compiled_step_count_only_when_something_is_not_finite() -> None:
    step = compiled_vitals_step()
    healthy = step(tf.ones((4, 3))).numpy()
    assert healthy[1:4].tolist() == [0, 0, 0]
    assert math.isclose(healthy[0], 9.0) and healthy[4] > 0
    x = np.ones((4, 3), np.float32)
    x[0, 0], x[2, 1] = np.nan, np.inf
    sick = step(tf.constant(x)).numpy()
    assert sick[1] == 1  # the loss
    assert sick[2] == 2  # the batch: exactly its two bad elements
    assert sick[3] == 6  # every gradient element
    # The counting stays a real conditional (not lowered to switch/merge), so a healthy
    # step does not push dead values through the counting operations.
    graph = step.get_concrete_function(tf.TensorSpec((4, 3), tf.float32)).graph
    conditionals = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert conditionals
    assert all(not op.get_attr("_lower_using_switch_merge") for op in conditionals)
    # Outside that conditional, the batch is read by the forward pass only: the checksum sums
    # the gradients' squares, one L2Loss for the kernel's gradient and none for the inputs.
    batch = graph.get_tensor_by_name("x:0")
    readers = {op.type for op in graph.get_operations() if any(t is batch for t in op.inputs)}
    assert [op.type for op in graph.get_operations()].count("L2Loss") == 1
    assert readers <= {"MatMul", "If", "StatelessIf"}, readers
