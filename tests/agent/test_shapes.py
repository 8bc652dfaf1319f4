"""Every input and model shape Keras accepts trains the same with the callback attached.

Each case is a small seeded ``fit``, run bare and with a ``VitalsCallback``: the weights must
be equal bit for bit, and the attached run must have stored the loss of every step. The
whole of Keras's own suite runs in ``make compat`` (``benchmarks/keras_suite.py``); a sample
of it runs here too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import trainvitals  # noqa: E402
from harness.processes import ROOT, ServerProcess, run_series  # noqa: E402

SAMPLES, BATCH = 32, 8  # 4 steps

#: A case: builds the model and returns it with fit's arguments (x, y and the rest).
Case = Callable[[], tuple[Any, dict[str, Any]]]


def _rng() -> np.random.Generator:
    return np.random.default_rng(5)


def _regressor(*layers: Any, inputs: Any = None) -> Any:
    first = keras.Input((4,)) if inputs is None else inputs
    model = keras.Sequential([first, *layers, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _xy() -> tuple[np.ndarray, np.ndarray]:
    x = _rng().normal(size=(SAMPLES, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def ragged() -> tuple[Any, dict[str, Any]]:
    class RaggedMean(keras.Model):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.head = keras.layers.Dense(1)

        def call(self, x: Any) -> Any:
            return self.head(tf.expand_dims(tf.reduce_mean(x, axis=1), -1))

    lengths = _rng().integers(1, 6, size=SAMPLES)
    x = tf.ragged.constant([list(np.linspace(0.0, 1.0, int(n))) for n in lengths], tf.float32)
    model = RaggedMean()
    model.compile(optimizer="adam", loss="mse")
    return model, {"x": x, "y": lengths.astype("float32").reshape(-1, 1)}


def sparse() -> tuple[Any, dict[str, Any]]:
    dense = (_rng().random((SAMPLES, 20)) < 0.2).astype("float32")
    x = tf.sparse.from_dense(dense)
    model = _regressor(keras.layers.Dense(4), inputs=keras.Input((20,), sparse=True))
    return model, {"x": x, "y": dense.sum(axis=1, keepdims=True)}


def strings() -> tuple[Any, dict[str, Any]]:
    words = np.array(["red", "green", "blue", "cyan"])
    texts = np.array([" ".join(_rng().choice(words, 3)) for _ in range(SAMPLES)])
    vectorize = keras.layers.TextVectorization(max_tokens=8, output_mode="multi_hot")
    vectorize.adapt(texts)
    model = keras.Sequential([keras.Input((), dtype="string"), vectorize, keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    # A tensor of strings: Keras's array adapter takes no NumPy unicode array, callback or not.
    return model, {"x": tf.constant(texts), "y": np.char.count(texts, "red").astype("float32")}


def dict_and_nested() -> tuple[Any, dict[str, Any]]:
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    c = keras.Input((2,), name="c")
    merged = keras.layers.Concatenate()([a, b, c])
    model = keras.Model({"a": a, "pair": {"b": b, "c": c}}, keras.layers.Dense(1)(merged))
    model.compile(optimizer="adam", loss="mse")
    rng = _rng()
    first = rng.normal(size=(SAMPLES, 4)).astype("float32")
    x = {
        "a": first,
        "pair": {
            "b": rng.normal(size=(SAMPLES, 3)).astype("float32"),
            "c": rng.normal(size=(SAMPLES, 2)).astype("float32"),
        },
    }
    return model, {"x": x, "y": first[:, :1]}


def integers_and_booleans() -> tuple[Any, dict[str, Any]]:
    ids, flags = keras.Input((5,), dtype="int32"), keras.Input((3,), dtype="bool")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(10, 2)(ids))
    as_float = keras.layers.Lambda(lambda t: keras.ops.cast(t, "float32"))(flags)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([embedded, as_float]))
    model = keras.Model([ids, flags], out)
    model.compile(optimizer="adam", loss="mse")
    rng = _rng()
    x = [rng.integers(0, 10, (SAMPLES, 5)).astype("int32"), rng.random((SAMPLES, 3)) < 0.5]
    return model, {"x": x, "y": x[0][:, :1].astype("float32")}


def multi_output() -> tuple[Any, dict[str, Any]]:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = {
        "reg": keras.layers.Dense(1, name="reg")(hidden),
        "cls": keras.layers.Dense(3, activation="softmax", name="cls")(hidden),
    }
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer="adam",
        loss={"reg": "mse", "cls": "sparse_categorical_crossentropy"},
        loss_weights={"reg": 0.5, "cls": 1.0},
        metrics={"cls": ["accuracy"]},
    )
    x, y = _xy()
    return model, {"x": x, "y": {"reg": y, "cls": (y[:, 0] > 0).astype("int32") + 1}}


def _classifier_data() -> tuple[np.ndarray, np.ndarray]:
    x, y = _xy()
    return x, (y[:, 0] > 0.5).astype("int32")


def _classifier() -> Any:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def sample_weights() -> tuple[Any, dict[str, Any]]:
    x, y = _classifier_data()
    return _classifier(), {"x": x, "y": y, "sample_weight": np.linspace(0.1, 2.0, SAMPLES)}


def class_weights() -> tuple[Any, dict[str, Any]]:
    x, y = _classifier_data()
    return _classifier(), {"x": x, "y": y, "class_weight": {0: 1.0, 1: 3.0}}


def guide_train_step() -> tuple[Any, dict[str, Any]]:
    class Guided(keras.Sequential):  # type: ignore[misc,name-defined]
        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else None
            return {m.name: m.result() for m in self.metrics}

    model = Guided([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x, y = _xy()
    return model, {"x": x, "y": y}


def compiled(**options: Any) -> Case:
    def case() -> tuple[Any, dict[str, Any]]:
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", **options)
        x, y = _xy()
        return model, {"x": x, "y": y}

    return case


def py_dataset() -> tuple[Any, dict[str, Any]]:
    x, y = _xy()

    class Batches(keras.utils.PyDataset):  # type: ignore[misc,name-defined]
        def __len__(self) -> int:
            return SAMPLES // BATCH

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            part = slice(index * BATCH, (index + 1) * BATCH)
            return x[part], y[part]

    data = Batches(workers=2, use_multiprocessing=False)
    return _regressor(keras.layers.Dense(4)), {"x": data}


def keras_hub_backbone() -> tuple[Any, dict[str, Any]]:
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=6,
    )  # fmt: skip
    pooled = backbone.output["pooled_output"]
    model = keras.Model(backbone.input, keras.layers.Dense(1)(pooled))
    model.compile(optimizer="adam", loss="mse")
    rng = _rng()
    x = {
        "token_ids": rng.integers(0, 50, (SAMPLES, 6)).astype("int32"),
        "segment_ids": np.zeros((SAMPLES, 6), "int32"),
        "padding_mask": np.ones((SAMPLES, 6), "int32"),
    }
    return model, {"x": x, "y": rng.normal(size=(SAMPLES, 1)).astype("float32")}


CASES: dict[str, Case] = {
    "ragged": ragged,
    "sparse": sparse,
    "strings": strings,
    "dict_and_nested": dict_and_nested,
    "integers_and_booleans": integers_and_booleans,
    "multi_output": multi_output,
    "sample_weight": sample_weights,
    "class_weight": class_weights,
    "guide_train_step": guide_train_step,
    "jit_compile": compiled(jit_compile=True),
    "run_eagerly": compiled(run_eagerly=True),
    "steps_per_execution": compiled(steps_per_execution=3),
    "py_dataset_workers": py_dataset,
    "keras_hub_bert": keras_hub_backbone,
}


def seeded_fit(case: Case, *callbacks: Any) -> tuple[Any, list[np.ndarray]]:
    keras.utils.set_random_seed(17)
    model, arguments = case()
    if not isinstance(arguments["x"], keras.utils.PyDataset):
        arguments = {"batch_size": BATCH, **arguments}
    model.fit(**arguments, epochs=1, verbose=0, shuffle=False, callbacks=list(callbacks))
    return model, [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize("name", list(CASES))
def test_every_shape_trains_bit_for_bit_the_same_and_is_measured(
    module_server: ServerProcess, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, bare = seeded_fit(CASES[name])
    vitals = trainvitals.VitalsCallback(
        server=module_server.url, run_name=name, system_metrics=False, watchdog=False
    )
    with caplog.at_level("WARNING", logger="trainvitals"):
        model, attached = seeded_fit(CASES[name], vitals)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("trainvitals")] == []
    assert len(bare) == len(attached)
    assert all(np.array_equal(a, b) for a, b in zip(bare, attached, strict=True))
    assert vitals.run is not None
    steps = SAMPLES // BATCH
    series = run_series(module_server, vitals.run.id, "loss")
    assert series["loss"]["step"] == list(range(1, steps + 1))
    # The tap is off once fit has returned: the model's own methods again.
    assert "train_step" not in vars(model) and "_trainvitals_tap" not in vars(model)


def test_the_environment_says_what_the_data_holds(module_server: ServerProcess) -> None:
    vitals = trainvitals.VitalsCallback(
        server=module_server.url, run_name="kinds", system_metrics=False, watchdog=False
    )
    seeded_fit(strings, vitals)
    assert vitals.run is not None
    run = module_server.get(f"/api/v1/runs/{vitals.run.id}")
    assert run["env"]["inputs"] == {"kinds": ["string"]}
    from trainvitals.agent import tf_vitals

    ragged_x = tf.ragged.constant([[1.0], [2.0, 3.0]])
    assert tf_vitals.input_kinds((ragged_x, object()))["kinds"] == ["ragged float32"]
    assert tf_vitals.input_kinds((ragged_x, object()))["not_counted"] == ["object"]
    dataset = tf.data.Dataset.from_tensor_slices({"a": np.zeros((4, 2), "float32")})
    assert tf_vitals.input_kinds(dataset) == {"kinds": ["float32"]}


def _paths(model: Any) -> list[str]:
    """The variables' paths without the numbers Keras appends to make names unique."""
    return [re.sub(r"_\d+", "", v.path) for v in model.variables]


def _unnumbered(line: str) -> str:
    """A summary line without the layers' numbers, nor the padding their width changed:
    dense_9 and dense_10 pad their column differently, whichever test ran first."""
    return re.sub(r" +", " ", re.sub(r"_\d+", "", line))


def test_the_model_keeps_nothing_of_the_agent(module_server: ServerProcess, tmp_path: Path) -> None:
    """Variables, summary, saved file and checkpoints are those of a bare fit."""
    bare_model, _ = seeded_fit(compiled())
    saved = tmp_path / "ckpt.weights.h5"
    checkpoint = keras.callbacks.ModelCheckpoint(str(saved), save_weights_only=True)
    vitals = trainvitals.VitalsCallback(
        server=module_server.url, run_name="kept", system_metrics=False, watchdog=False
    )
    model, _ = seeded_fit(compiled(), vitals, checkpoint)
    assert _paths(model) == _paths(bare_model)
    lines: list[str] = []
    model.summary(print_fn=lines.append)
    bare_lines: list[str] = []
    bare_model.summary(print_fn=bare_lines.append)
    assert [_unnumbered(line) for line in lines] == [_unnumbered(line) for line in bare_lines]
    model.save(tmp_path / "model.keras")
    with zipfile.ZipFile(tmp_path / "model.keras") as archive:
        assert not any(b"trainvitals" in archive.read(n) for n in archive.namelist())
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert len(loaded.variables) == len(bare_model.variables)
    assert b"trainvitals" not in saved.read_bytes()


MIRRORED = textwrap.dedent(
    """
    import sys
    import numpy as np, tensorflow as tf, keras, trainvitals
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def fit(*callbacks):
        keras.utils.set_random_seed(17)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
        x = np.random.default_rng(5).normal(size=(32, 4)).astype("float32")
        model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1, verbose=0,
                  shuffle=False, callbacks=list(callbacks))
        return model.get_weights()

    bare = fit()
    vitals = trainvitals.VitalsCallback(server=sys.argv[1], run_name="two-cpus",
                                        system_metrics=False, watchdog=False)
    attached = fit(vitals)
    assert all(np.array_equal(a, b) for a, b in zip(bare, attached, strict=True))
    print(vitals.run.id)
    """
)


def test_a_mirrored_strategy_over_two_logical_cpus_trains_the_same(
    module_server: ServerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED)
    done = subprocess.run(
        [sys.executable, str(script), module_server.url],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.strip().splitlines()[-1]
    series = run_series(module_server, run_id, "loss")
    assert series["loss"]["step"] == [1, 2, 3, 4]


#: A sample of Keras's own suite (make compat runs all of it): a NaN, dict losses.
KERAS_SAMPLE = (
    "src/callbacks/terminate_on_nan_test.py::TerminateOnNaNTest::test_TerminateOnNaN",
    "src/models/model_test.py::ModelTest::test_functional_dict_outputs_dict_losses",
)


def test_a_sample_of_kerass_own_tests_passes_with_the_callback() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "keras_suite.py"), "--attached-only",
         *KERAS_SAMPLE],
        capture_output=True, text=True, timeout=280, cwd=ROOT,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "'failed'" not in summary and "with the callback; 0 differences" in summary, summary
