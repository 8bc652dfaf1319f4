"""The demo's scenarios: real Keras runs that go wrong the way training does.

Each scenario trains a small real model on scikit-learn's bundled digits with
:class:`~trainvitals.agent.keras_callback.VitalsCallback` attached, and breaks it in one familiar
way, so the dashboard shows the alert that warns of it:

- ``healthy``: nothing goes wrong; a CNN that learns, and no alert.
- ``nan-input``: one training batch carries a NaN pixel: ``nonfinite``.
- ``explode``: a learning-rate warm-up that never stops: ``grad_explosion``.
- ``diverge``: a schedule that raises the learning rate instead of decaying it:
  ``loss_divergence``.
- ``leak``: every step keeps a new buffer alive: ``oom_forecast``.
- ``hang``: the input generator waits on a lock nobody releases: ``stall``.
- ``vanishing``: a deep sigmoid network whose first layers stop learning: ``grad_vanishing``.

The failing steps are fixed (see the constants below) so tests can check that each alert
comes before the point of no return.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import keras
import numpy as np
import psutil

from trainvitals.agent.host import cgroup_memory_limit, effective_memory_limit
from trainvitals.agent.protect import Protection

#: Steps of the digits training set at the demo's batch size (1500 images, batches of 32).
BATCH = 32
#: ``nan-input``: the step whose batch carries the NaN.
NAN_STEP = 200
#: ``explode``: the warm-up multiplies the learning rate by this every step, from 1e-3.
EXPLODE_GROWTH = 1.005
#: ``diverge``: the step from which the learning rate grows DIVERGE_GROWTH-fold a step.
DIVERGE_STEP = 300
DIVERGE_GROWTH = 1.01
#: ``hang``: the step whose batch the generator never hands over (until ``hang_for``).
HANG_STEP = 150
#: ``leak``: without a memory cgroup, the leak stops at this share of the memory available
#: when it began, so the demo warns without taking the machine down.
LEAK_SHARE = 0.4


@dataclass
class Options:
    """What the command line can change about a scenario."""

    epochs: int = 30
    #: ``leak``: seconds the leak would take to exhaust the memory limit.
    time_to_oom: float = 180.0
    #: ``hang``: seconds the generator waits before it hands the batch over after all.
    hang_for: float = 90.0


class FitArgs(TypedDict, total=False):
    """What a scenario passes to ``model.fit`` beside ``x``, ``y`` and the callbacks."""

    validation_data: tuple[np.ndarray, np.ndarray]
    epochs: int
    batch_size: int
    steps_per_epoch: int
    shuffle: bool


#: Hyper-parameters shown with the run: numbers, or words where a schedule needs them.
Config = dict[str, str | float]


@dataclass
class Plan:
    """One scenario's training: ``model.fit(x, y, **fit)`` with ``callbacks`` added."""

    model: keras.Model
    x: Any
    y: Any = None
    fit: FitArgs = field(default_factory=lambda: FitArgs())
    callbacks: list[keras.callbacks.Callback] = field(default_factory=list)
    protect: Protection | None = None
    config: Config = field(default_factory=dict)
    #: One line the demo prints before training: what to look for.
    story: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    #: The rule the scenario's alert comes from (None: no alert expected).
    rule: str | None
    plan: Callable[[Options], Plan]


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits as (train, validation) image batches, shuffled reproducibly."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def build_model(learning_rate: Any = 1e-3) -> keras.Model:
    """The demo's CNN: conv, pool, dense with dropout, softmax over the ten digits."""
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv"),
            keras.layers.MaxPooling2D(name="pool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(64, activation="relu", name="dense"),
            keras.layers.Dropout(0.2, name="dropout"),
            keras.layers.Dense(10, activation="softmax", name="logits"),
        ],
        name="digits_cnn",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _cnn_plan(options: Options, model: keras.Model | None = None, **config: str | float) -> Plan:
    (x, y), validation = digits()
    return Plan(
        model=model or build_model(),
        x=x,
        y=y,
        fit={"validation_data": validation, "epochs": options.epochs, "batch_size": BATCH},
        config={"learning_rate": 1e-3, "dataset": "sklearn digits", **config},
    )


def healthy(options: Options) -> Plan:
    plan = _cnn_plan(options)
    plan.story = "A healthy run: the loss falls, nothing fires."
    return plan


def nan_input(options: Options) -> Plan:
    import tensorflow as tf

    plan = _cnn_plan(options)
    steps = len(plan.x) // BATCH

    def poison(index: Any, batch: Any) -> Any:
        images, labels = batch
        bad = tf.tensor_scatter_nd_update(images, [[7, 3, 4, 0]], [float("nan")])
        return tf.where(index == NAN_STEP - 1, bad, images), labels

    # One pipeline over every epoch (kept across epochs because steps_per_epoch is given),
    # so the NaN pixel is in step NAN_STEP's batch only.
    data = tf.data.Dataset.from_tensor_slices((plan.x, plan.y)).shuffle(1500, seed=0)
    data = data.batch(BATCH, drop_remainder=True).repeat().enumerate().map(poison)
    plan.x, plan.y = data.prefetch(2), None
    del plan.fit["batch_size"]
    plan.fit["steps_per_epoch"] = steps
    plan.fit["shuffle"] = False  # the pipeline shuffles
    plan.protect = _protection("nan-input")
    plan.story = (
        f"Step {NAN_STEP}'s batch carries one NaN pixel: the nonfinite alert names the inputs; "
        "the agent's protection restores the last healthy weights and stops."
    )
    return plan


class _Climb(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]
    """``base`` until step ``at``, then growing ``growth``-fold a step: a warm-up that never
    ends (``at`` = 0), or a decay with its sign flipped."""

    def __init__(self, base: float, at: int, growth: float) -> None:
        self.base, self.at, self.growth = base, at, growth

    def __call__(self, step: Any) -> Any:
        from keras import ops

        late = ops.maximum(ops.cast(step, "float32") - self.at, 0.0)
        return self.base * ops.power(self.growth, late)

    def get_config(self) -> dict[str, float]:
        return {"base": self.base, "at": self.at, "growth": self.growth}


def explode(options: Options) -> Plan:
    (x, y), _ = digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="tanh", name="hidden_1"),
            keras.layers.Dense(64, activation="tanh", name="hidden_2"),
            keras.layers.Dense(1, name="value"),
        ],
        name="digit_regressor",
    )
    model.compile(optimizer=keras.optimizers.SGD(_Climb(1e-3, 0, EXPLODE_GROWTH)), loss="mse")
    flat = x.reshape(len(x), -1)
    return Plan(
        model=model,
        x=flat,
        y=y.astype("float32"),
        fit={"epochs": options.epochs, "batch_size": BATCH},
        protect=_protection("explode"),
        config={"learning_rate": f"1e-3 x {EXPLODE_GROWTH}^step", "dataset": "sklearn digits"},
        story=(
            f"The learning rate grows {EXPLODE_GROWTH}x a step without end: gradients explode "
            "and grad_explosion fires well before the loss turns NaN."
        ),
    )


def diverge(options: Options) -> Plan:
    keras.utils.set_random_seed(0)
    plan = _cnn_plan(options, build_model(_Climb(1e-3, DIVERGE_STEP, DIVERGE_GROWTH)))
    plan.config["learning_rate"] = f"1e-3, x{DIVERGE_GROWTH} a step from step {DIVERGE_STEP}"
    plan.story = (
        f"From step {DIVERGE_STEP} the learning rate grows {DIVERGE_GROWTH}x a step: the loss "
        "climbs back without a NaN, and loss_divergence fires before all is lost."
    )
    return plan


class _Leak(keras.callbacks.Callback):  # type: ignore[misc]
    """Keeps every step's new buffer alive (as a list of per-step outputs kept "for later"
    would), at a pace that would exhaust the memory limit in ``time_to_oom`` seconds."""

    def __init__(self, time_to_oom: float) -> None:
        super().__init__()
        self._time_to_oom = time_to_oom
        self.kept: list[np.ndarray] = []
        self._kept_bytes = 0

    def on_train_begin(self, logs: Mapping[str, float] | None = None) -> None:
        # What the leak must fill is the limit less this process's own (anonymous) memory: its
        # file-backed pages (TensorFlow's libraries, some 400 MB of the resident set) are
        # dropped by the kernel before it kills anyone, so counting them made the leak take
        # nearly twice its time_to_oom.
        memory = psutil.Process().memory_info()
        anonymous = memory.rss - getattr(memory, "shared", 0)  # "shared" is Linux's file pages
        self._rate = max(effective_memory_limit() - anonymous, 2**26) / self._time_to_oom
        # Under a memory cgroup the leak goes on until the kernel's OOM killer ends it;
        # on the bare machine it stops at a share of what is available, and so does training.
        self._cap = (
            math.inf
            if cgroup_memory_limit() is not None
            else LEAK_SHARE * psutil.virtual_memory().available
        )
        self._began = time.monotonic()
        print(f"Leaking {self._rate / 2**20:.1f} MiB/s", flush=True)

    def on_train_batch_end(self, batch: int, logs: Mapping[str, float] | None = None) -> None:
        due = min(self._rate * (time.monotonic() - self._began), self._cap)
        if due - self._kept_bytes >= 2**20:
            size = int(due - self._kept_bytes)
            self.kept.append(np.ones(size // 8))  # written, so the pages are really taken
            self._kept_bytes += size
        if self._kept_bytes >= self._cap:
            print("The leak reached its cap; stopping.", flush=True)
            self.model.stop_training = True


def leak(options: Options) -> Plan:
    plan = _cnn_plan(options)
    plan.fit["epochs"] = max(options.epochs, 100_000)  # trains until the leak ends it
    plan.callbacks.append(_Leak(options.time_to_oom))
    plan.config["time_to_oom"] = options.time_to_oom
    plan.story = (
        f"Every step keeps a new buffer alive; memory would run out in about "
        f"{options.time_to_oom:g} s. oom_forecast gives the ETA long before."
    )
    return plan


def _batches(
    x: np.ndarray, y: np.ndarray, epochs: int, stuck: threading.Event, hang_for: float
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The digits in batches, from a Python generator that blocks before step HANG_STEP's
    batch, waiting for a lock's release that comes only after ``hang_for`` seconds."""
    steps = len(x) // BATCH
    for step in range(epochs * steps):
        if step + 1 == HANG_STEP:
            stuck.wait(hang_for)  # the frame a stall report's stack points at
        start = (step % steps) * BATCH
        yield x[start : start + BATCH], y[start : start + BATCH]


def hang(options: Options) -> Plan:
    plan = _cnn_plan(options)
    data = _batches(plan.x, plan.y, options.epochs, threading.Event(), options.hang_for)
    plan.x, plan.y = data, None
    plan.fit.pop("batch_size")
    plan.fit["epochs"] = 1
    plan.fit["steps_per_epoch"] = options.epochs * (1500 // BATCH)
    plan.config["hang_for"] = options.hang_for
    plan.story = (
        f"The input generator blocks before step {HANG_STEP} for {options.hang_for:g} s: "
        "the run turns stalled with the generator's stack, then running again."
    )
    return plan


def vanishing(options: Options) -> Plan:
    (x, y), validation = digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            *(keras.layers.Dense(32, activation="sigmoid", name=f"sigmoid_{i}") for i in range(12)),
            keras.layers.Dense(10, activation="softmax", name="logits"),
        ],
        name="deep_sigmoid",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return Plan(
        model=model,
        x=x.reshape(len(x), -1),
        y=y,
        fit={
            "validation_data": (validation[0].reshape(len(validation[0]), -1), validation[1]),
            "epochs": options.epochs,
            "batch_size": BATCH,
        },
        config={"learning_rate": 0.01, "layers": 13, "dataset": "sklearn digits"},
        story=(
            "Thirteen sigmoid layers: the first layers' gradients are orders of magnitude "
            "below the last's and the loss stays flat; grad_vanishing fires."
        ),
    )


def _protection(name: str) -> Protection:
    checkpoint = Path(tempfile.gettempdir()) / f"trainvitals-demo-{name}.weights.h5"
    return Protection(str(checkpoint), on_nonfinite="stop", good_every=50)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("healthy", None, healthy),
        Scenario("nan-input", "nonfinite", nan_input),
        Scenario("explode", "grad_explosion", explode),
        Scenario("diverge", "loss_divergence", diverge),
        Scenario("leak", "oom_forecast", leak),
        Scenario("hang", "stall", hang),
        Scenario("vanishing", "grad_vanishing", vanishing),
    ]
}
