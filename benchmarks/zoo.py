"""Detection measured over a population of generated runs, as the literature measures it.

Each run is a small real Keras ``fit`` on CPU (seconds), drawn at random from architectures
(MLP, CNN with batch norm, LSTM/GRU, a Transformer encoder, an embedding model, a tiny
``keras_hub`` BERT backbone), optimizers (SGD with and without momentum, Adam, AdamW, RMSprop,
Adagrad), schedules (constant, warm-up, cosine, step decay), batch sizes (4 to 256), mixed
precision on some, and data (digits, synthetic classification, regression, sequences,
tokens). A run is healthy, or has one failure injected at a random step and strength (see
``CLASSES``). Each runs in its own process (a kill or a hang must not take the zoo down),
forked from one that has imported TensorFlow already, and streams with a ``VitalsCallback``
to one real ``trainvitals serve``. A loop of short fits (``leak_fits``) makes a run a fit,
judged together as the server judges the runs of one process.

Each run carries its ground truth: its class, the rules that should fire and the causes they
should name, and its point of no return, read back from the server as
``harness/outcomes.py`` reads it for the hand-made scenarios (the first NaN/Inf, the loss
back at its start, the kill, the last step). The JSON report gives, per class and over all:
recall (the right rule fired), the share warned before the point of no return (of the
classes that can have a precursor), the lead (median and 10th percentile, steps: the point of
no return less the step of the right rule's first alarm), diagnosis accuracy (that alarm
names the right cause: for NaN/Inf, its origin or the autopsy's cause), the healthy runs'
false-alarm rate (any warning or critical alert) and the seconds a run took.

Determinism: each run's recorded stream is judged again by the detector, directly, cut into
frames of one second of the run (as the agent cuts it) and into frames of random sizes at
another pace (its times stretched); every alert that differs between the two is reported
(rules about time itself aside: ``harness/framing.py``).

    python benchmarks/zoo.py --runs 60 --seed 1 --json zoo.json [--workers 2]
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import itertools
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from harness import framing
from harness import outcomes as sc
from harness.polling import wait_for
from harness.processes import ServerProcess, memory_cgroup, run_series
from trainvitals.detect import AlertBook, Detector, Finding, RuleSet
from trainvitals.detect.memory import PROCESS_RULES, ProcessMemory
from trainvitals.protocol import Columns
from trainvitals.server.storage import RunSummary

#: Failure classes: the rules that should fire, the causes the first alarm should name, how
#: the point of no return is found, and whether a precursor can come before it (a kill or an
#: exception has none: the run is lost at the very step).
NONFINITE_OR_LOSS = ("first_nonfinite", "loss_back_at_start", "last_step")


@dataclass(frozen=True)
class FailureClass:
    rules: tuple[str, ...]
    causes: tuple[str, ...]
    lost: tuple[str, ...]
    precursor: bool = True


CLASSES: dict[str, FailureClass] = {
    "lr_sudden": FailureClass(
        ("grad_explosion", "loss_divergence", "nonfinite"),
        ("learning_rate", "weights", "loss", "grads", "lr_blowup", "poisoned_weights", "layer"),
        NONFINITE_OR_LOSS,
    ),
    "lr_growing": FailureClass(
        ("grad_explosion", "loss_divergence", "nonfinite"),
        ("learning_rate", "weights", "loss", "grads", "lr_blowup", "poisoned_weights", "layer"),
        NONFINITE_OR_LOSS,
    ),
    "nan_data": FailureClass(("nonfinite",), ("inputs",), ("first_nonfinite",), False),
    "label_noise": FailureClass(
        ("loss_divergence",), ("data",), ("loss_back_at_start", "last_step")
    ),
    "bad_init": FailureClass(
        ("loss_above_chance", "grad_explosion", "loss_divergence", "nonfinite", "grad_vanishing"),
        (
            "initialisation",
            "weights",
            "loss",
            "grads",
            "gradients",
            "vanishing",
            "poisoned_weights",
            "layer",
        ),
        ("first_nonfinite", "last_step"),
        False,
    ),
    "vanishing": FailureClass(("grad_vanishing",), ("vanishing",), ("last_step",)),
    "dying_relu": FailureClass(("grad_vanishing",), ("vanishing",), ("last_step",)),
    # The autopsy names a custom layer's domain error "layer", a custom loss's "loss".
    "domain_error": FailureClass(("nonfinite",), ("loss", "layer"), ("first_nonfinite",), False),
    "exception": FailureClass(("crash",), ("exception",), ("last_step",), False),
    "kill": FailureClass(("crash",), ("signal:SIGKILL",), ("last_step",), False),
    "slowdown": FailureClass(("slowdown",), ("slowdown",), ("last_step",)),
    "hang": FailureClass(("stall",), ("hang",), ("stuck",), False),
    "leak": FailureClass(
        ("oom_forecast", "memory_pressure", "crash"), ("memory", "oom_killed"), ("killed",)
    ),
    # A loop of short fits that keeps something of every one: flat within each, growing
    # between them (the process's runs share the memory rules).
    "leak_fits": FailureClass(
        ("oom_forecast", "memory_pressure", "crash"), ("memory", "oom_killed"), ("killed",)
    ),
    # Busy processes on the run's one CPU: the steps slow down for real, not by a sleep.
    "contention": FailureClass(("slowdown",), ("slowdown",), ("last_step",)),
}
#: Drawn at these odds; a quarter of the runs healthy.
ODDS = {"healthy": 6, **dict.fromkeys(CLASSES, 1), "lr_sudden": 2, "lr_growing": 2}
#: The memory the leaking runs may use (their cgroup's limit).
LEAK_LIMIT = 1400 * 2**20
#: Seconds the competing load of a contention run lasts at least: the run trains on past its
#: steps until then (a slowdown is one that lasts; the small models' steps take a millisecond).
CONTENTION_SECONDS = 5.0
#: Seconds a run may take before it is killed; a hung run waits for its stall alert.
RUN_TIMEOUT = 240.0
STALL_FLOOR = 3.0
#: Where each run's recorded stream is written (``--streams``), or None.
STREAMS: Path | None = None

# -- the draw ----------------------------------------------------------------------------------

DATA_ARCHS = {
    "digits": ("mlp", "cnn", "rnn", "transformer"),
    "blobs": ("mlp",),
    "regression": ("mlp",),
    "sequences": ("rnn", "transformer", "mlp"),
    "tokens": ("embedding", "hub_bert"),
}
OPTIMIZERS = {  # the base learning rate each trains well at on these data
    "sgd": 0.05, "sgd_momentum": 0.01, "adam": 1e-3, "adamw": 1e-3, "rmsprop": 5e-4,
    "adagrad": 0.03,
}  # fmt: skip
SCHEDULES = ("constant", "warmup", "cosine", "step")
BATCHES = (4, 8, 16, 32, 64, 128, 256)


def draw(rng: np.random.Generator, index: int, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """One run's recipe: everything the child needs to train it, and its ground truth
    (``only``: the classes to draw from, by default all at their ``ODDS``)."""
    kinds = list(only or ODDS)
    odds = np.array([ODDS[k] for k in kinds], float)
    kind = kinds[int(rng.choice(len(kinds), p=odds / odds.sum()))]
    data = str(rng.choice(list(DATA_ARCHS)))
    if kind in ("label_noise", "nan_data") and data == "tokens":  # NaN needs float inputs
        data = "digits"
    arch = str(rng.choice(DATA_ARCHS[data]))
    optimizer = str(rng.choice(list(OPTIMIZERS)))
    batch = int(rng.choice(BATCHES if arch in ("mlp", "cnn", "embedding") else BATCHES[:5]))
    steps = (
        int(rng.integers(400, 1001))
        if arch in ("mlp", "embedding")
        else int(rng.integers(300, 701))
    )
    spec: dict[str, Any] = {
        "index": index,
        "kind": kind,
        "seed": int(rng.integers(0, 2**31)),
        "data": data,
        "arch": arch,
        "optimizer": optimizer,
        "lr": OPTIMIZERS[optimizer] * float(10 ** rng.uniform(-0.3, 0.3)),
        "schedule": str(rng.choice(SCHEDULES)),
        "batch": batch,
        "steps": steps,
        "mixed": bool(arch in ("mlp", "cnn") and rng.random() < 0.15),
        "at": int(steps * rng.uniform(0.3, 0.6)),
        "strength": float(rng.random()),
    }
    if kind == "vanishing":  # a deep sigmoid stack: the failure is the architecture
        spec.update(arch="deep_sigmoid", data=str(rng.choice(["digits", "blobs"])), at=1)
    elif kind == "dying_relu":
        spec.update(arch="deep_relu", data=str(rng.choice(["digits", "blobs", "regression"])))
    elif kind == "bad_init":
        spec["at"] = 1
    elif kind in ("exception", "kill", "hang", "slowdown", "leak", "leak_fits", "contention"):
        spec["mixed"] = False
    # The leaking runs are MLPs, which take tokens' ids as numbers: they learn nothing from
    # them, and start far above chance (no new draw, so that the runs after are as before).
    if kind in ("leak", "leak_fits") and data == "tokens":
        spec["data"] = "sequences"
    if kind == "leak":  # a leak needs the time for a trend: a slow, long run
        spec.update(arch="mlp", batch=int(rng.choice([4, 8])), steps=100_000)
    elif kind == "leak_fits":  # fits of 20-60 steps until the limit, kept from the 4th-12th
        fit = int(rng.integers(20, 61))
        at = fit * int(rng.integers(4, 13))
        spec.update(arch="mlp", batch=int(rng.choice([4, 8])), steps=100_000, fit=fit, at=at)
    return spec


# -- the child: one run --------------------------------------------------------------------


def _dataset(spec: dict[str, Any], rng: np.random.Generator) -> tuple[Any, Any, int]:
    """Inputs, targets and the number of classes (0: a regression)."""
    from trainvitals.demo.scenarios import digits

    data, arch = spec["data"], spec["arch"]
    if data == "digits":
        (x, y), _ = digits()
        if arch in ("rnn", "transformer"):  # the image's rows as a sequence
            return x[..., 0], y, 10
        return (x if arch == "cnn" else x.reshape(len(x), -1)), y, 10
    if data == "blobs":
        centres = rng.normal(0, 1, (4, 32))
        y = rng.integers(0, 4, 2000)
        return (centres[y] + rng.normal(0, 1.2, (2000, 32))).astype("float32"), y, 4
    if data == "regression":
        x = rng.normal(0, 1, (2000, 32)).astype("float32")
        w = rng.normal(0, 1, 32) / np.sqrt(32)
        return x, (np.tanh(x @ w * 2) + 0.1 * rng.normal(0, 1, 2000)).astype("float32"), 0
    if data == "sequences":
        x = rng.normal(0, 1, (2000, 16, 8)).astype("float32")
        y = (x[:, :, 0].sum(axis=1) + x[:, -4:, 1].sum(axis=1) > 0).astype("int32")
        return (x.reshape(len(x), -1) if arch == "mlp" else x), y, 2
    tokens = rng.integers(1, 50, (2000, 16))
    y = (tokens == 7).any(axis=1).astype("int32") + (tokens == 11).any(axis=1).astype("int32")
    return tokens.astype("int32"), y, 3


def _schedule(spec: dict[str, Any]) -> Any:
    """The drawn schedule, times the injected learning-rate change."""
    import keras
    from keras import ops

    base, total, kind = spec["lr"], spec["steps"], spec["schedule"]
    at, strength, failure = spec["at"], spec["strength"], spec["kind"]
    sudden = 10 ** (1.5 + 1.5 * strength)  # 30x to 1000x at once
    span = max(total - at, 50) * (0.4 + 0.6 * strength)
    growth = 1000 ** (1 / span)  # 1000x over the rest of the run, or sooner

    class Zoo(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
        def __call__(self, step: Any) -> Any:
            s = ops.cast(step, "float32")
            if kind == "warmup":
                rate = base * ops.minimum(1.0, 0.1 + 0.9 * s / (0.1 * total))
            elif kind == "cosine":
                rate = base * (0.1 + 0.9 * 0.5 * (1 + ops.cos(math.pi * ops.minimum(s / total, 1))))
            elif kind == "step":
                rate = base * ops.power(0.5, ops.floor(s / (total / 3)))
            else:
                rate = base + 0.0 * s
            late = ops.maximum(s - (at - 1), 0.0)
            if failure == "lr_sudden":
                rate = rate * ops.where(late > 0, sudden, 1.0)
            elif failure == "lr_growing":
                rate = rate * ops.power(growth, late)
            return rate

        def get_config(self) -> dict[str, Any]:
            return {}

    return Zoo()


def _optimizer(spec: dict[str, Any]) -> Any:
    import keras

    rate = _schedule(spec)
    name = spec["optimizer"]
    made = {
        "sgd": lambda: keras.optimizers.SGD(rate),
        "sgd_momentum": lambda: keras.optimizers.SGD(rate, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(rate),
        "adamw": lambda: keras.optimizers.AdamW(rate, weight_decay=1e-3),
        "rmsprop": lambda: keras.optimizers.RMSprop(rate),
        "adagrad": lambda: keras.optimizers.Adagrad(rate),
    }[name]()
    return keras.optimizers.LossScaleOptimizer(made) if spec["mixed"] else made


def _model(spec: dict[str, Any], shape: tuple[int, ...], classes: int) -> Any:
    import keras

    kind, arch = spec["kind"], spec["arch"]
    init: Any = "glorot_uniform"
    if kind == "bad_init":  # weights far too large from the start
        init = keras.initializers.RandomNormal(stddev=3 + 30 * spec["strength"])
    dense = {"kernel_initializer": init}
    inputs = keras.Input(shape, dtype="int32" if arch in ("embedding", "hub_bert") else None)
    h: Any = inputs
    if arch == "mlp":
        for width in (64, 64):
            h = keras.layers.Dense(width, activation="relu", **dense)(h)
    elif arch == "deep_sigmoid":
        for _ in range(10 + int(4 * spec["strength"])):
            h = keras.layers.Dense(32, activation="sigmoid", **dense)(h)
    elif arch == "deep_relu":
        for i in range(4):
            h = keras.layers.Dense(64, activation="relu", name=f"relu_{i}")(h)
    elif arch == "cnn":
        h = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, **dense)(h)
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        h = keras.layers.Conv2D(32, 3, padding="same", activation="relu", **dense)(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
    elif arch == "rnn":
        layer = keras.layers.LSTM if spec["seed"] % 2 else keras.layers.GRU
        h = layer(32, kernel_initializer=init)(h)
    elif arch == "transformer":
        h = keras.layers.Dense(32, **dense)(h)
        attended = keras.layers.MultiHeadAttention(4, 8, kernel_initializer=init)(h, h)
        h = keras.layers.LayerNormalization()(h + attended)
        feed = keras.layers.Dense(32, **dense)(keras.layers.Dense(64, activation="gelu")(h))
        h = keras.layers.GlobalAveragePooling1D()(keras.layers.LayerNormalization()(h + feed))
    elif arch == "embedding":
        h = keras.layers.Embedding(50, 16, embeddings_initializer=init)(h)
        h = keras.layers.GlobalAveragePooling1D()(h)
        h = keras.layers.Dense(32, activation="relu", **dense)(h)
    elif arch == "hub_bert":
        import keras_hub

        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
            max_sequence_length=shape[0],
        )  # fmt: skip
        mask = keras.ops.ones_like(inputs)
        h = backbone({"token_ids": inputs, "segment_ids": 0 * inputs, "padding_mask": mask})
        h = h["pooled_output"]
    if spec["kind"] == "domain_error" and spec["strength"] < 0.5:
        h = _domain_layer()(name="domain")(h)
    out = keras.layers.Dense(classes or 1, **dense)(h)
    out = keras.layers.Activation("linear", dtype="float32")(out)
    return keras.Model(inputs, out)


def _domain_layer() -> Any:
    import keras

    class DomainLayer(keras.layers.Layer):  # type: ignore[misc]
        """``sqrt(x^2 + shift)``: a smooth magnitude, until ``shift`` turns negative."""

        def build(self, shape: Any) -> None:
            self.shift = self.add_weight(shape=(), initializer="ones", trainable=False)

        def call(self, x: Any) -> Any:
            return keras.ops.sqrt(keras.ops.square(x) + self.shift) - 1.0

    return DomainLayer


def _loss(spec: dict[str, Any], classes: int, shift: Any) -> Any:
    import keras

    if spec["kind"] == "domain_error" and spec["strength"] >= 0.5:

        def log_cosh(y_true: Any, y_pred: Any) -> Any:
            """A log-cosh loss written by hand, with a floor that a bug turns negative."""
            if classes:
                y_pred = keras.ops.take_along_axis(
                    y_pred, keras.ops.cast(keras.ops.reshape(y_true, (-1, 1)), "int32"), axis=1
                )
                y_true = keras.ops.ones_like(y_pred)
            err = keras.ops.reshape(y_pred, (-1,)) - keras.ops.reshape(y_true, (-1,))
            return keras.ops.mean(keras.ops.log(keras.ops.cosh(err) + shift))

        return log_cosh
    if classes:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return "mse"


def train(spec: dict[str, Any], server: str, name: str, extra: tuple[Any, ...] = ()) -> None:
    """Train the run ``spec`` describes, streaming to ``server`` as ``name`` (with the
    callbacks ``extra`` too: a probe of benchmarks/update_ratio.py)."""
    import keras
    import tensorflow as tf

    import trainvitals

    keras.utils.set_random_seed(spec["seed"])
    rng = np.random.default_rng(spec["seed"])
    x, y, classes = _dataset(spec, rng)
    if spec["mixed"]:
        keras.mixed_precision.set_global_policy("mixed_float16")
    kind, at, strength, batch = spec["kind"], spec["at"], spec["strength"], spec["batch"]
    shift = tf.Variable(1.0, trainable=False)  # the custom loss's floor
    model = _model(spec, x.shape[1:], classes)
    model.compile(_optimizer(spec), _loss(spec, classes, shift))
    per_epoch = max(1, len(x) // batch)
    leaked: list[bytes] = []
    hogs: list[subprocess.Popen[bytes]] = []

    def batches() -> Iterator[tuple[Any, Any]]:
        step = 0
        while True:
            order = rng.permutation(len(x))
            for b in range(per_epoch):
                step += 1
                pick = order[b * batch : (b + 1) * batch]
                xb, yb = x[pick].copy(), y[pick].copy()
                if step >= at and kind == "label_noise":  # ever more labels wrong
                    share = (0.5 + 0.5 * strength) * min(1.0, (step - at) / (100 + 200 * strength))
                    wrong = rng.random(len(yb)) < share
                    # A wrong target is another class, or another sample's value: what a
                    # bad join or a mislabelling gives, not an outlier.
                    yb[wrong] = (
                        rng.integers(0, classes, int(wrong.sum())) if classes
                        else rng.permutation(yb)[wrong]
                    )  # fmt: skip
                if step == at and kind == "nan_data":
                    flat = xb.reshape(-1)
                    bad = rng.choice(flat.size, max(1, int(flat.size * strength**3)), False)
                    flat[bad] = np.nan if strength < 0.5 else np.inf
                if step == at and kind == "hang":
                    time.sleep(3600)  # the input pipeline blocks for good
                yield xb, yb

    class Inject(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.contended = math.inf  # when the competing load began

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.step += 1
            if self.step >= at and kind == "slowdown":  # a competing load: each step slower
                time.sleep(0.004 + 0.02 * strength)
            if self.step >= at and kind == "leak":  # memory held forever, a step at a time
                leaked.append(os.urandom(int((64 + 192 * strength) * 1024)))
            if self.step != at:
                return
            if kind == "exception":
                raise RuntimeError(f"a bug in the training code at step {at}")
            if kind == "kill":
                os.kill(os.getpid(), 9)
            if kind == "contention":  # 2 to 5 busy processes on the run's CPU from now on
                hogs.extend(competing(2 + int(4 * strength)))
                self.contended = time.monotonic()
            if kind == "dying_relu":  # a bad update sends every unit below zero
                for layer in self.model.layers:
                    if layer.name.startswith("relu_"):
                        layer.bias.assign(np.full(layer.bias.shape, -5 - 45 * strength))
            if kind == "domain_error":
                shift.assign(-2.0)
                for layer in self.model.layers:
                    if layer.name == "domain":
                        layer.shift.assign(-2.0)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            lasted = time.monotonic() - self.contended >= CONTENTION_SECONDS
            if kind == "contention" and self.step >= spec["steps"] and lasted:
                self.model.stop_training = True

    vitals = trainvitals.VitalsCallback(
        server=server, project="zoo", run_name=name, config={"zoo": spec}
    )
    callbacks = [Inject(), *extra, vitals]
    epochs = math.ceil(spec["steps"] / per_epoch)
    if kind == "contention":  # on until the load has lasted (Inject), at most 20 times as long
        epochs *= 20
    try:
        if kind == "leak_fits":
            _fits(model, batches(), spec, callbacks)
        else:
            model.fit(
                batches(), steps_per_epoch=per_epoch, epochs=epochs, callbacks=callbacks,
                verbose=0,
            )  # fmt: skip
    finally:
        ended = [hog.poll() for hog in hogs]  # None: still competing, as it should be
        for hog in hogs:
            hog.kill()
            hog.wait()
    if any(code is not None for code in ended):
        raise RuntimeError(f"competing processes ended before the run did (exit codes {ended})")


def _fits(model: Any, data: Iterator[Any], spec: dict[str, Any], callbacks: list[Any]) -> None:
    """A loop of short fits with the same callbacks (a run each), as folds or curriculum
    stages are trained: from the fit that reaches step ``at`` on, the loop keeps 8 to 64 MiB
    of every fit, written so that it is resident."""
    kept: list[Any] = []
    size = int((8 + 56 * spec["strength"]) * 2**20)
    for fit in range(1, math.ceil(spec["steps"] / spec["fit"]) + 1):
        model.fit(data, steps_per_epoch=spec["fit"], epochs=1, callbacks=callbacks, verbose=0)
        if fit * spec["fit"] >= spec["at"]:
            kept.append(np.full(size // 8, fit, dtype=np.int64))


#: A busy loop on one CPU (``argv[1]``) for as long as the process ``argv[2]`` lives: once
#: that has died the loop is orphaned, and its parent changes.
HOG = """import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent = int(sys.argv[2])
while os.getppid() == parent:
    pass
"""


def competing(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that compete for this process's CPU (``_child`` pins a run to one)."""
    cpus, me = os.sched_getaffinity(0), os.getpid()
    if len(cpus) != 1:
        raise RuntimeError(f"a contention run competes on its one CPU, but may run on {cpus}")
    (cpu,) = cpus
    return [subprocess.Popen([sys.executable, "-c", HOG, str(cpu), str(me)]) for _ in range(n)]


# -- the judge -----------------------------------------------------------------------------


@dataclass
class Judged:
    """One run: its recipe, what fired, its point of no return, and the verdicts."""

    name: str
    spec: dict[str, Any]
    seconds: float
    returncode: int | None
    steps: int = 0
    alarms: list[dict[str, Any]] = field(default_factory=list)
    lost_at: int | None = None
    lost_by: str | None = None
    detected: bool = False
    lead: int | None = None
    diagnosed: bool = False
    first_alarm: str | None = None
    cause: str | None = None
    replay_differs: list[str] = field(default_factory=list)
    error: str | None = None
    #: The server's alarms as it raised them live (kept with ``--streams`` to judge again).
    live: list[dict[str, Any]] = field(default_factory=list)
    #: The failure left no mark to find (:func:`without_effect`): not counted among failures.
    no_effect: bool = False
    #: A loop of fits (a run each): the steps before each fit. Steps are counted across the
    #: fits (the process's), alarms and the point of no return included. Empty: one fit.
    fits: list[int] = field(default_factory=list)


def cause_of(alarm: Mapping[str, Any]) -> str:
    """The cause an alarm names: where NaN/Inf came from (the autopsy's verdict if it has
    one), the learning rate when the evidence shows it risen, how the run ended..."""
    rule, evidence = alarm["rule"], alarm.get("evidence") or {}
    if rule == "nonfinite":
        autopsy = evidence.get("autopsy")
        if isinstance(autopsy, dict) and autopsy.get("cause"):
            return str(autopsy["cause"])
        return str(evidence.get("origin", "nonfinite"))
    if rule in ("grad_explosion", "loss_divergence"):
        # The rate then against the rate training was at its best at (or rose from), else
        # against the first (a warm-up's first rate is far below the rate it learns at).
        lr = evidence.get("lr")
        first = evidence.get("lr_at_minimum", evidence.get("lr_before", evidence.get("lr_first")))
        if isinstance(lr, int | float) and isinstance(first, int | float) and lr >= 2 * first > 0:
            return "learning_rate"
        return "data" if rule == "loss_divergence" else "gradients"
    if rule == "crash":
        return str(evidence.get("end_reason", "crash"))
    named = {
        "grad_vanishing": "vanishing", "stall": "hang", "slowdown": "slowdown",
        "oom_forecast": "memory", "memory_pressure": "memory",
        "loss_above_chance": "initialisation",
    }  # fmt: skip
    return named.get(rule, str(rule))


def _last_step(server: ServerProcess, run: RunSummary) -> tuple[int, float] | None:
    return run["last_step"] or 0, run["ended_at"] or run["last_seen"]


LOST: dict[str, Callable[[ServerProcess, RunSummary], tuple[int, float] | None]] = {
    "first_nonfinite": sc.first_nonfinite,
    "loss_back_at_start": sc.loss_back_at_start,
    "killed": sc.killed,
    "last_step": _last_step,
}


def _stuck(server: ServerProcess, run: RunSummary, at: int) -> tuple[int, float] | None:
    return int(at - 1), 0.0


def judge(server: ServerProcess, result: Judged) -> None:
    """What the server made of the run (of each of its fits, for a loop of them), against
    its ground truth."""
    spec = result.spec
    done = sc.outcome(server, "zoo", result.name)
    runs = _fits_of(server, done.run) if "fit" in spec else [done.run]
    run = runs[-1]  # a loop's last fit: the one its end came in
    starts = list(itertools.accumulate((int(r["last_step"] or 0) for r in runs[:-1]), initial=0))
    result.fits = starts if "fit" in spec else []
    result.steps = starts[-1] + int(run["last_step"] or 0)
    kept = [recorded(server, r["id"]) for r in runs]
    fits, env = [stream for stream, _ in kept], kept[0][1]
    # An alert shows its last firing: each rule's first, with its evidence then, is the
    # detector's on the recorded stream (the same, as the replays below check).
    first = first_alarms(fits, result.fits, env)
    alarms, seen = [], set()
    result.live = _live(server, runs, starts)
    for alert in sorted(result.live, key=lambda a: a["time"]):
        if alert["rule"] in seen:  # fired again after its cooldown: a new alert
            continue
        seen.add(alert["rule"])
        again = first.get(alert["rule"])
        if again is not None and again.time != alert["time"]:
            result.replay_differs.append(
                f"live: {alert['rule']} first at t={alert['time']}, replayed at step "
                f"{again.step} t={again.time}"
            )
        source = asdict(again) if again is not None else alert
        alarms.append({k: source[k] for k in ("rule", "severity", "step", "message", "evidence")})
    result.alarms = sorted(alarms, key=lambda a: int(a["step"]))
    if spec["kind"] != "healthy":
        for how in CLASSES[spec["kind"]].lost:
            found = _stuck(server, run, spec["at"]) if how == "stuck" else LOST[how](server, run)
            found = None if found is None else (starts[-1] + found[0], found[1])
            if found is not None and found[0] >= spec["at"]:  # noise before it is no loss
                result.lost_at, result.lost_by = found[0], how
                break
    result.no_effect = without_effect(spec, {} if result.fits else fits[0], env)
    verdict(result)
    result.replay_differs += differences(fits, result.fits, env, spec["seed"])
    if STREAMS is None:
        return
    if result.fits:  # a stream a fit, in order
        (STREAMS / f"{result.name}.fits").mkdir(exist_ok=True)
        for i, stream in enumerate(fits):
            framing.save(STREAMS / f"{result.name}.fits" / f"{i:04d}.json.gz", stream, env)
    else:  # kept for the determinism test's fixtures
        framing.save(STREAMS / f"{result.name}.json.gz", fits[0], env)


def _live(server: ServerProcess, runs: list[RunSummary], starts: list[int]) -> list[dict[str, Any]]:
    """The alarms the server raised on the runs, each once (a loop's memory alerts move from
    fit to fit), at the process's steps: those of the fit that was running when it fired."""
    began = [float(r["started_at"]) for r in runs]
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        for a in server.get(f"/api/v1/runs/{run['id']}/alerts")["alerts"]:
            if a["severity"] not in sc.ALARMS:
                continue
            fit = max(0, bisect.bisect_right(began, a["time"]) - 1)
            out[a["id"]] = {
                **{k: a.get(k) for k in ("rule", "severity", "time", "message", "evidence")},
                "step": starts[fit] + a["step"],
            }
    return list(out.values())


# -- a loop of fits: a run each, judged as the server judges the process ----------------------


def _fits_of(server: ServerProcess, first: RunSummary) -> list[RunSummary]:
    """The runs the process that made ``first`` made (a fit each), in order, once all ended."""
    if not first["process_key"]:  # an agent that does not name its process
        return [first]
    process = quote(first["process_key"], safe="")
    path = f"/api/v1/runs?project=zoo&process={process}&sort=started_at&order=asc&limit=10000"

    def ended() -> list[RunSummary] | None:
        runs: list[RunSummary] = server.get(path)["runs"]
        return runs if all(r["status"] not in ("running", "stalled") for r in runs) else None

    # A fit killed before its watchdog could tell ends when the server has heard nothing of it
    # for its ``lost_after`` (30 s).
    return wait_for(ended, timeout=45, what=f"the fits of {first['name']} to end")


def judged(
    fits: Sequence[framing.Stream],
    starts: list[int],
    cuts: list[list[int]],
    env: Mapping[str, Any] | None = None,
) -> Iterator[Finding]:
    """The findings that raise an alert, of a loop's fits judged as the server judges the
    runs of one process: a detector a fit, the memory rules the process's (shared from fit
    to fit), each fit fed in the frames of its cut; at the process's steps (``starts``: the
    steps before each fit)."""
    memory = ProcessMemory(RuleSet())
    for i, (stream, start, ends) in enumerate(zip(fits, starts, cuts, strict=True)):
        detector, book = Detector(env=env, memory=memory.rules), AlertBook()
        memory.join(str(i), str(i), detector.context)
        for frame in framing.frames(stream, ends):
            for finding in detector.feed(frame):
                change = (memory.book if finding.rule in PROCESS_RULES else book).apply(finding)
                if change and change[0] != "resolved":
                    yield replace(finding, step=start + finding.step)


def first_alarms(
    fits: Sequence[framing.Stream], starts: list[int], env: Mapping[str, Any] | None = None
) -> dict[str, Finding]:
    """Each rule's first warning or critical finding, in the agent's frames: on the run's
    stream (:func:`framing.first_alarms`), or on a loop's fits (``starts``) as one process."""
    if not starts:
        return framing.first_alarms(fits[0], env)
    return framing.firsts(judged(fits, starts, [framing.by_seconds(s) for s in fits], env))


def differences(
    fits: Sequence[framing.Stream], starts: list[int], env: Mapping[str, Any] | None, seed: int
) -> list[str]:
    """Every alert that differs between the agent's frames and random frames at half the pace
    (:func:`framing.differences`), of the run, or of a loop's fits as one process."""
    if not starts:
        return framing.differences(fits[0], env, seed)
    t0 = min((t[0] for stream in fits for _, t, _ in stream.values() if len(t)), default=0.0)
    slower = [framing.stretched(stream, 2.0, t0) for stream in fits]  # the fits in order
    first = judged(fits, starts, [framing.by_seconds(s) for s in fits], env)
    second = judged(
        slower, starts, [framing.at_random(s, seed + i) for i, s in enumerate(fits)], env
    )
    return framing.differing(framing.raised_by(first), framing.raised_by(second))


def without_effect(
    spec: dict[str, Any], stream: Mapping[str, Any], env: Mapping[str, Any] | None = None
) -> bool:
    """Whether the injected failure left no mark: labels gone wrong in a run whose loss had
    never left its start (its 11-step median never below 90% of the first 20 losses' median
    before the injection) take nothing away, and the stream is a healthy run that does not
    learn (its "point of no return" would be noise); weights drawn wide in a classifier that
    started where a fresh one starts (its first 20 losses' median within 1.2x its loss at
    chance, as the healthy runs' are) and learned (under half of it, no NaN) were tamed by its
    normalisation, and the stream is a healthy run's."""
    if "loss" not in stream:
        return False
    steps, _, values = (np.asarray(c, dtype=float) for c in stream["loss"])
    if spec["kind"] == "bad_init":
        chance = (env or {}).get("loss_at_chance")
        if not isinstance(chance, Mapping) or len(values) < 40 or not np.isfinite(values).all():
            return False
        level = float(chance["value"])
        smooth = sc.trailing_median(values)[10:]  # full windows only
        return bool(np.median(values[:20]) <= 1.2 * level and smooth.min() < 0.5 * level)
    if spec["kind"] != "label_noise":
        return False
    before = np.isfinite(values) & (steps < spec["at"])
    losses = values[before]
    if len(losses) < 20:
        return False
    return bool(sc.trailing_median(losses).min() >= 0.9 * float(np.median(losses[:20])))


def verdict(result: Judged) -> None:
    """The run's alarms against its ground truth: detected, diagnosed, the lead."""
    result.first_alarm = result.alarms[0]["rule"] if result.alarms else None
    result.detected, result.diagnosed, result.cause, result.lead = False, False, None, None
    if result.spec["kind"] == "healthy":
        return
    truth = CLASSES[result.spec["kind"]]
    # Before its injection a run is a healthy one: an alarm there (a false alarm on its
    # healthy start, or a real trouble of its own) is not the injected failure found.
    fired = [a for a in result.alarms if a["rule"] in truth.rules and not _before(result, a)]
    result.detected = bool(fired)
    if fired:
        result.cause = cause_of(fired[0])
        result.diagnosed = result.cause in truth.causes
        if result.lost_at is not None:
            result.lead = result.lost_at - fired[0]["step"]


def _before(result: Judged, alarm: Mapping[str, Any]) -> bool:
    """Whether ``alarm`` came before the run's failure was injected (a failure injected at
    step 1, bad initialisation or vanishing gradients, has no such steps). The rules raised
    outside the stream (a silence, the run's end) come after it by their nature, whatever
    step the server gives them (the last one stored, or none)."""
    at = int(result.spec.get("at", 1))
    return at > 1 and alarm["rule"] not in OFF_STREAM and int(alarm["step"]) < at


#: Rules raised by the server outside the stream (a silence, the run's end, its hello): a run
#: judged again keeps them as they were raised live.
OFF_STREAM = frozenset({"stall", "crash", "env_mismatch"})


def rejudge(path: Path) -> Judged:
    """A run recorded with ``--streams`` (its ``.run.json``), judged again by the detector as
    it is now: the rules on the stream replayed, the others as the server raised them."""
    kept = json.loads(path.read_text())
    names = {f.name for f in fields(Judged)}
    result = Judged(**{k: v for k, v in kept.items() if k in names})
    result.replay_differs = []
    result.error = result.error or _timed_out(result)
    stem = path.name.removesuffix(".run.json")
    paths = (
        sorted(path.with_name(f"{stem}.fits").glob("*.json.gz"))
        if result.fits
        else [path.with_name(f"{stem}.json.gz")]
    )
    if result.error is not None or not paths or not all(p.exists() for p in paths):
        return result
    kept = [framing.load(p) for p in paths]
    fits, env = [stream for stream, _ in kept], kept[0][1]
    alarms = [
        {k: a[k] for k in ("rule", "severity", "step", "message", "evidence")}
        for a in _firsts(result.live)
        if a["rule"] in OFF_STREAM
    ]
    alarms += [
        {
            k: v
            for k, v in asdict(f).items()
            if k in ("rule", "severity", "step", "message", "evidence")
        }
        for f in first_alarms(fits, result.fits, env).values()
        if f.rule not in OFF_STREAM
    ]
    result.alarms = sorted(alarms, key=lambda a: int(a["step"]))
    if not result.fits:
        lost_again(result, fits[0])
    result.no_effect = without_effect(result.spec, {} if result.fits else fits[0], env)
    verdict(result)
    result.replay_differs = differences(fits, result.fits, env, result.spec["seed"])
    return result


def lost_again(result: Judged, stream: Mapping[str, Any]) -> None:
    """The point of no return read again from the recorded loss, where the loss gives it (a
    stream recorded before :func:`harness.outcomes.loss_lost` changed is judged as it reads
    now); one a NaN or the kill gave stands."""
    truth = CLASSES.get(result.spec["kind"])
    if truth is None or "loss_back_at_start" not in truth.lost or "loss" not in stream:
        return
    if result.lost_by not in ("loss_back_at_start", "last_step"):
        return
    found = sc.loss_lost(*stream["loss"])
    if found is not None and found[0] >= result.spec["at"]:
        result.lost_at, result.lost_by = found[0], "loss_back_at_start"
    elif result.lost_by == "loss_back_at_start":  # the loss never gave it back: the last step
        result.lost_at, result.lost_by = result.steps, "last_step"


def _timed_out(result: Judged) -> str | None:
    """Why a run the zoo killed for running past ``RUN_TIMEOUT`` is not judged: its end (a
    SIGKILL, seen by the server as a crash) is the zoo's doing, not the run's."""
    if result.returncode is None and result.spec["kind"] != "hang":
        return f"still training after {RUN_TIMEOUT:g} s: killed, not judged"
    return None


def _firsts(alarms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rule's first alarm (by time) of those given."""
    out: dict[str, dict[str, Any]] = {}
    for alarm in sorted(alarms, key=lambda a: a["time"] or 0.0):
        out.setdefault(alarm["rule"], alarm)
    return list(out.values())


def rejudged(directory: Path, workers: int = 1) -> list[Judged]:
    """Every run recorded in ``directory``, judged again (:func:`rejudge`)."""
    paths = sorted(directory.glob("*.run.json"))
    if workers <= 1:
        return [rejudge(p) for p in paths]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(rejudge, paths))


def recorded(server: ServerProcess, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's watched series as the server stored them (NaN/Inf back as NaN), and its
    environment."""
    from trainvitals.detect import watched

    detail = server.get(f"/api/v1/runs/{run_id}")
    names = [n for n in detail.get("series", []) if watched(n)]
    columns: dict[str, Any] = {}
    for i in range(0, len(names), 20):
        for name, s in run_series(server, run_id, *names[i : i + 20]).items():
            values = [math.nan if v is None else float(v) for v in s["value"]]
            columns[name] = Columns([int(v) for v in s["step"]], list(s["time"]), values)
    return columns, detail.get("env") or {}


# -- the zoo ---------------------------------------------------------------------------------


#: Each run is a process of its own (a kill or a hang must not take the zoo down), forked
#: from one that has imported TensorFlow and Keras already: a fresh interpreter spends 15-20
#: s of a 30 s run importing them (2-core VM, loaded), the training itself about 2 s.
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["tensorflow", "keras"])


def _child(
    spec: dict[str, Any], server: str, name: str, group: str | None, err: str, cpu: int | None
) -> None:
    """Train one run in a forked child, ended as an interpreter ends a script: an uncaught
    exception goes to ``sys.excepthook`` and then the ``atexit`` handlers run (the agent
    reports how the run ended from there), which a forked child would otherwise skip."""
    if cpu is not None:  # before TensorFlow starts its threads: they all inherit it
        os.sched_setaffinity(0, {cpu})
    if group is not None:  # into the memory cgroup before it allocates anything of its own
        Path(group, "cgroup.procs").write_text(str(os.getpid()))
    with open(err, "w") as errors, open(os.devnull, "w") as devnull:
        os.dup2(errors.fileno(), 2)
        os.dup2(devnull.fileno(), 1)
    os.environ["TRAINVITALS_STALL_FLOOR"] = str(STALL_FLOOR)
    code = 0
    try:
        train(spec, server, name)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        atexit._run_exitfuncs()
        sys.stderr.flush()
    os._exit(code)


#: The classes whose runs end by a signal or an exception, by design.
KILLED = ("exception", "kill", "hang", "leak", "leak_fits")
#: The runs pinned to each CPU this zoo may use: a contention run takes the least taken, so
#: that two at once compete on CPUs of their own where there are two.
_PINNED = dict.fromkeys(sorted(os.sched_getaffinity(0)), 0)
_PINNING = threading.Lock()


@contextmanager
def _a_cpu() -> Iterator[int]:
    with _PINNING:
        cpu = min(_PINNED, key=_PINNED.__getitem__)
        _PINNED[cpu] += 1
    try:
        yield cpu
    finally:
        with _PINNING:
            _PINNED[cpu] -= 1


def run_one(server: ServerProcess, spec: dict[str, Any], zoo_seed: int) -> Judged:
    name = f"zoo{zoo_seed}-{spec['index']:03d}-{spec['kind']}"
    started = time.monotonic()
    code: int | None = None
    group: AbstractContextManager[Any] = nullcontext()
    if spec["kind"] in ("leak", "leak_fits"):
        group = memory_cgroup(LEAK_LIMIT)
    pin: AbstractContextManager[int | None] = nullcontext()
    if spec["kind"] == "contention":
        pin = _a_cpu()
    with group as cgroup, pin as cpu, tempfile.NamedTemporaryFile(suffix=".err") as err_file:
        where = None if cgroup is None else str(cgroup)
        child = FORKS.Process(
            target=_child, args=(spec, server.url, name, where, err_file.name, cpu), name=name
        )
        child.start()
        try:
            if spec["kind"] == "hang":  # wait for the stall alert, then end it
                try:
                    wait_for(lambda: _stalled(server, name), timeout=90, interval=0.5)
                finally:
                    child.kill()
            child.join(RUN_TIMEOUT)
            code = child.exitcode
        except AssertionError:
            code = None
        if child.exitcode is None:  # past its time
            child.kill()
            child.join()
        err = Path(err_file.name).read_text(errors="replace")
    result = Judged(name, spec, time.monotonic() - started, code)
    if code not in (0, None) and spec["kind"] not in KILLED:
        result.error = (err or "").strip().splitlines()[-1:][0] if err else f"exit {code}"
    result.error = result.error or _timed_out(result)
    try:
        judge(server, result)
    except AssertionError as exc:  # the run never reached the server
        result.error = result.error or str(exc)[:300]
    if STREAMS is not None:  # what the run was and what the server saw, to judge again
        kept = json.dumps(asdict(result), default=str)
        (STREAMS / f"{name}.run.json").write_text(kept)
    return result


def _stalled(server: ServerProcess, name: str) -> bool:
    runs = [r for r in server.get("/api/v1/runs?limit=500")["runs"] if r["name"] == name]
    if not runs:
        return False
    alerts = server.get(f"/api/v1/runs/{runs[0]['id']}/alerts")["alerts"]
    return any(a["rule"] == "stall" for a in alerts)


def _quantile(values: list[int], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


#: The issue's goals over a seed: (figure, the classes it is taken over (all: None), at
#: least (True) or at most, the bar).
GOALS: dict[str, tuple[str, tuple[str, ...] | None, bool, float]] = {
    "recall": ("recall", None, True, 0.98),
    "warned_before_point_of_no_return": ("warned_before_point_of_no_return", None, True, 0.90),
    "diagnosis": ("diagnosis_accuracy", None, True, 0.95),
    "lead_learning_rate_blow_ups": ("median_lead_steps", ("lr_sudden", "lr_growing"), True, 50),
    "lead_gradual_divergences": ("median_lead_steps", ("label_noise",), True, 30),
    "healthy_false_alarms": ("false_alarm_rate", None, False, 0.01),
}


def goals(failures: list[Judged], healthy_rate: float | None, summary: Any) -> dict[str, Any]:
    """Each goal: its figure, whether it is met, and the classes that miss it (those whose
    own figure is on the wrong side of the bar)."""
    out: dict[str, Any] = {}
    for name, (figure, kinds, at_least, bar) in GOALS.items():
        if figure == "false_alarm_rate":
            value, missing = healthy_rate, []
        else:
            group = [r for r in failures if kinds is None or r.spec["kind"] in kinds]
            value = summary(group)[figure]
            missing = [
                kind
                for kind in (kinds or CLASSES)
                if (own := summary([r for r in group if r.spec["kind"] == kind])[figure])
                is not None
                and (own < bar if at_least else own > bar)
            ]
        met = None if value is None else (value >= bar if at_least else value <= bar)
        out[name] = {"value": value, "goal": bar, "met": met, "classes_missing": missing}
    return out


def report(results: list[Judged], seed: int) -> dict[str, Any]:
    """The figures: per class and over all failures, the healthy runs, determinism."""
    ok = [r for r in results if r.error is None]
    failures = [r for r in ok if r.spec["kind"] != "healthy" and not r.no_effect]
    healthy = [r for r in ok if r.spec["kind"] == "healthy"]

    def summary(group: list[Judged]) -> dict[str, Any]:
        leads = [r.lead for r in group if r.lead is not None]
        precursor = [r for r in group if CLASSES[r.spec["kind"]].precursor]
        return {
            "runs": len(group),
            "recall": len([r for r in group if r.detected]) / len(group) if group else None,
            "warned_before_point_of_no_return": (
                len([r for r in precursor if r.lead is not None and r.lead > 0]) / len(precursor)
                if precursor
                else None
            ),
            "median_lead_steps": _quantile(leads, 0.5),
            "lead_p10_steps": _quantile(leads, 0.1),
            "diagnosis_accuracy": (
                len([r for r in group if r.diagnosed]) / len(group) if group else None
            ),
        }

    per_class = {
        kind: summary([r for r in failures if r.spec["kind"] == kind])
        for kind in CLASSES
        if any(r.spec["kind"] == kind for r in failures)
    }
    false_alarms = [r for r in healthy if r.alarms]
    early = [r for r in failures if any(_before(r, a) for a in r.alarms)]
    differs = [r for r in ok if r.replay_differs]
    seconds = [r.seconds for r in results]
    return {
        "seed": seed,
        "runs": len(results),
        "errors": [{"run": r.name, "error": r.error} for r in results if r.error],
        # Failures injected where they could leave no mark (without_effect): not counted.
        "without_effect": [r.name for r in ok if r.no_effect],
        "classes_implemented": ["healthy", *CLASSES],
        "failures": {**summary(failures), "per_class": per_class},
        "healthy": {
            "runs": len(healthy),
            "false_alarm_rate": len(false_alarms) / len(healthy) if healthy else None,
            "false_alarms": [
                {"run": r.name, "alarms": [(a["rule"], a["step"], a["message"]) for a in r.alarms]}
                for r in false_alarms
            ],
        },
        "diagnosis_accuracy": summary(failures)["diagnosis_accuracy"],
        # Failure runs with an alarm before their failure was injected, on their healthy start.
        "alarms_before_injection": {
            "runs": len(early),
            "rate": len(early) / len(failures) if failures else None,
            "alarms": [
                {
                    "run": r.name,
                    "at": r.spec.get("at"),
                    "alarms": [(a["rule"], a["step"]) for a in r.alarms if _before(r, a)],
                }
                for r in early
            ],
        },
        "goals": goals(failures, len(false_alarms) / len(healthy) if healthy else None, summary),
        "misses": [
            {
                "run": r.name,
                "kind": r.spec["kind"],
                "alarms": [(a["rule"], a["step"]) for a in r.alarms],
                "lost_at": r.lost_at,
                "detected": r.detected,
                "cause": r.cause,
            }
            for r in failures
            if not r.diagnosed or not r.detected
        ],
        "determinism": {
            "runs_differing": len(differs),
            "differences": {r.name: r.replay_differs for r in differs},
        },
        "seconds_per_run": statistics.median(seconds) if seconds else None,
        "runs_detail": [
            {
                **{k: v for k, v in asdict(r).items() if k != "live"},
                "alarms": [(a["rule"], a["severity"], a["step"]) for a in r.alarms],
            }
            for r in results
        ],
    }


def summary_line(figures: dict[str, Any]) -> str:
    f, h = figures["failures"], figures["healthy"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    return (
        f"zoo seed {figures['seed']}: {figures['runs']} runs ({f['runs']} failures, "
        f"{h['runs']} healthy, {len(figures['errors'])} errors, "
        f"{len(figures['without_effect'])} without effect): recall {pct(f['recall'])}, "
        f"warned before the point of no return {pct(f['warned_before_point_of_no_return'])}, "
        f"median lead {f['median_lead_steps']} steps (p10 {f['lead_p10_steps']}), "
        f"diagnosis {pct(figures['diagnosis_accuracy'])}, healthy false alarms "
        f"{pct(h['false_alarm_rate'])}, failures with an alarm before their injection "
        f"{pct(figures['alarms_before_injection']['rate'])}, replays differing "
        f"{figures['determinism']['runs_differing']}, "
        f"{figures['seconds_per_run']:.1f} s a run; goals missed: "
        + (
            "; ".join(
                f"{name} ({', '.join(goal['classes_missing']) or 'over all'})"
                for name, goal in figures["goals"].items()
                if goal["met"] is False
            )
            or "none"
        )
    )


def zoo(runs: int, seed: int, workers: int = 1, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Generate and judge ``runs`` runs drawn with ``seed`` (from the classes ``only``, by
    default all); the report's figures."""
    rng = np.random.default_rng(seed)
    specs = [draw(rng, i, only) for i in range(runs)]
    # With --streams, a run recorded there already (an earlier, interrupted zoo of the same
    # seed) is taken as it was recorded, not trained again.
    done = {s["index"]: _recorded_run(s, seed) for s in specs} if STREAMS is not None else {}
    todo = [s for s in specs if done.get(s["index"]) is None]
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "zoo.db"))
        try:
            with ThreadPoolExecutor(max(1, workers)) as pool:
                trained = list(pool.map(lambda spec: run_one(server, spec, seed), todo))
        finally:
            server.stop()
    results = [r for r in done.values() if r is not None] + trained
    return report(sorted(results, key=lambda r: r.spec["index"]), seed)


def _recorded_run(spec: dict[str, Any], seed: int) -> Judged | None:
    assert STREAMS is not None
    path = STREAMS / f"zoo{seed}-{spec['index']:03d}-{spec['kind']}.run.json"
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    return Judged(**{f.name: kept[f.name] for f in fields(Judged) if f.name in kept})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--workers", type=int, default=1, help="runs trained at once")
    parser.add_argument("--only", default="", help="comma-separated classes to draw (all)")
    parser.add_argument("--streams", type=Path, help="write each run's stream here (json.gz)")
    parser.add_argument(
        "--judge", type=Path, help="judge the runs --streams recorded here again; train none"
    )
    args = parser.parse_args()
    if args.judge:
        results = rejudged(args.judge, args.workers)
        seeds = {int(r.name.split("-")[0].removeprefix("zoo")) for r in results}
        figures = report(results, seeds.pop() if len(seeds) == 1 else args.seed)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1, default=str))
        print(summary_line(figures))
        return
    if args.streams:
        global STREAMS
        STREAMS = args.streams
        STREAMS.mkdir(parents=True, exist_ok=True)
    figures = zoo(args.runs, args.seed, args.workers, tuple(filter(None, args.only.split(","))))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    print(summary_line(figures))


if __name__ == "__main__":
    main()
