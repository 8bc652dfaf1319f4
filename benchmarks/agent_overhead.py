"""Time per training step: bare ``fit`` vs ``VitalsCallback`` (every vital on) vs Keras's
``TensorBoard(update_freq="batch")``, alternated in one run on a ~2 ms MLP and a small CNN at
a larger batch (a step of 10 ms or more).

Each fit runs in a fresh process (``--worker``), so no run inherits another's threads, traces
or allocator state: it builds the model, traces a short bare fit, then runs ``--steps`` steps
of the configuration, and the time from the step after ``--warmup`` to the end of training
is divided by the steps (tracing, which the callback's instrumentation redoes once per fit,
and the watchdog's start are once per run, not per step). Rounds rotate the order of the
three configurations. A shared machine drifts by more than the effect measured, so each
round's ratio is taken against the bare run of that same round; every round's ratio is
printed, with the median and the spread, and the budgets: ≤ 1.04x bare on the MLP, ≤ 1.01x
on a step of 10 ms or more, and less than half of what TensorBoard adds. The VitalsCallback
streams to a real server in another process on the same cores, with the per-second sampler
on.

First, the in-step vitals alone (``in_step_cost``): the compiled step with and without them
(written into the device ring, as the callback's step does), alternated step by step, several
traces of each in several fresh processes (``--in-step``), since traces and processes differ by
as much as the vitals; beside them, each gradient's sum of squares alone, which any per-step
gradient norm has to pay. Then the callback's per-step hooks alone
(``hook_cost``), called as Keras calls them. Then CPU per step by thread (the training
thread, the agent's sender and sampler, TensorFlow's own threads) and in the server process
(``/proc``), each against the bare run's: CPU time does not count the time a thread waits
for a core, so these are steadier than the wall-clock ratios here.

Last, within one fit (``--windowed``, ``WindowGate``): the agent's background work (its
sender and sampler threads, and with them the server's work on the same cores) held and let go
in alternate 0.4 s windows, each adjacent pair giving one ratio; beside it, the same for a
known load (10 ms of CPU a second), which shows what the measurement resolves. The whole cost
is then the in-step vitals and hooks (paired) times the background's ratio, with its spread,
against the budgets: ``met`` only when the whole interval is within the budget.

    python benchmarks/agent_overhead.py [--rounds 7] [--steps 800] [--warmup 200]
        [--cnn-batch 384] [--pairs 500] [--instances 4] [--hook-steps 5000] [--windowed-seconds 60]

``--against REF`` measures a change to the agent instead: this checkout's ``VitalsCallback``
against the one at git ``REF`` (checked out in a temporary worktree and imported ahead of
this one), alternated in fresh processes round by round, on the same server: each round's
step-time ratio, and the agent's threads' CPU a step, this checkout's over REF's.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras
import numpy as np

import trainvitals
from harness.processes import ROOT, ServerProcess, cpu_seconds, git_worktree
from trainvitals.agent.config import DEFAULT_FLUSH_INTERVAL

BATCH = 32


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process, by kind of thread: each Python thread's own clock
    (nanoseconds), and the rest of the process (TensorFlow's threads) as the difference."""
    kinds: dict[str, float] = {}
    total = time.process_time()
    python = 0.0
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
        except (OSError, AttributeError):
            continue  # the thread ended, or no per-thread clocks here
        name = thread.name
        if name == "MainThread":
            kind = "training thread"
        elif name.startswith("ThreadPoolExecutor"):
            kind = "Keras callback threads"  # where the backend is thread-safe (not TF's)
        elif name.startswith("trainvitals-"):
            kind = name
        else:
            kind = "other Python threads"
        kinds[kind] = kinds.get(kind, 0.0) + seconds
        python += seconds
    kinds["TensorFlow's threads"] = total - python
    return kinds


class CpuProbe(keras.callbacks.Callback):  # type: ignore[misc]
    """CPU seconds per step by kind of thread, between the warm-up step and the end of
    training (read before Keras stops its callback threads)."""

    async_safe = True

    def __init__(self, warmup: int, server_pid: int) -> None:
        super().__init__()
        self.warmup, self.server_pid = warmup, server_pid
        self.start: dict[str, float] = {}
        self.per_step: dict[str, float] = {}

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if batch == self.warmup:
            self.start = thread_cpu()
            self.start["server process"] = cpu_seconds(self.server_pid)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        end = thread_cpu()
        end["server process"] = cpu_seconds(self.server_pid)
        steps = self.params["steps"] - self.warmup
        self.per_step = {k: (end[k] - self.start.get(k, 0.0)) / steps for k in end}


class StepTimer(keras.callbacks.Callback):  # type: ignore[misc]
    """Seconds per step after warm-up. Async-safe: it adds no per-step sync of its own."""

    async_safe = True

    def __init__(self, warmup: int) -> None:
        super().__init__()
        self.warmup = warmup
        self.started = 0.0
        self.seconds_per_step = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if batch == self.warmup:
            self.started = time.perf_counter()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        steps = self.params["steps"] - self.warmup
        self.seconds_per_step = (time.perf_counter() - self.started) / steps


def mlp() -> tuple[Any, np.ndarray, np.ndarray]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(384, activation="relu"),
            keras.layers.Dense(384, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    x = np.random.default_rng(0).normal(size=(BATCH * 1000, 64)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, size=(BATCH * 1000,))
    return model, x, y


def cnn() -> tuple[Any, np.ndarray, np.ndarray]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    x = np.random.default_rng(0).normal(size=(BATCH * 1000, 28, 28, 1)).astype("float32")
    y = np.random.default_rng(1).integers(0, 10, size=(BATCH * 1000,))
    return model, x, y


def regression() -> Any:
    """A compiled one-output regression, for the loss its level at chance is measured with."""
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse")
    return model


#: The benchmark's two models, by the name the command line and the output use.
MODELS: dict[str, Callable[[], tuple[Any, np.ndarray, np.ndarray]]] = {"MLP": mlp, "CNN": cnn}


def run_fit(
    model: Any, x: np.ndarray, y: np.ndarray, steps: int, warmup: int, extra: list[Any]
) -> float:
    timer = StepTimer(warmup)  # first, so the end-of-training flush is not counted as steps
    model.fit(
        x[: steps * BATCH],
        y[: steps * BATCH],
        batch_size=BATCH,
        epochs=1,
        verbose=0,
        shuffle=False,
        callbacks=[timer, *extra],
    )
    return timer.seconds_per_step


def in_step_cost(
    build: Callable[[], tuple[Any, np.ndarray, np.ndarray]], pairs: int, batch: int, instances: int
) -> dict[str, Any]:
    """The in-step vitals alone (``tf_vitals.step_vitals``, what the callback adds to the
    compiled train step): the same compiled step with and without them, on the same model and
    batch, alternated step by step, which resolves a few microseconds here. No Keras loop
    around it: against a ``fit`` step, which also pays for Keras's loop, the share is smaller.

    Each variant is traced ``instances`` times, as separate functions, and every instance of
    every variant runs once a round, in rotated order. Two traces of the very same step differ
    by a steady amount of their own (on the benchmark's CNN by ±100 µs on a 15 ms step, the
    same size as the vitals; likely where their buffers land), which one function of each could
    not tell from the vitals; and traces made later run faster, so the traces are made in a
    shuffled order. Each instance's figure is the median, over the rounds, of its
    time less the mean of that round's bare instances. Processes differ as much again (the
    vitals on the CNN measured from -124 to +152 µs in single processes), so this runs in
    several fresh processes (``--in-step``) and :func:`in_step_summary` puts them together.

    Returns the bare step's median (``bare``, seconds) and each variant's per-instance
    figures (``each``, seconds added)."""
    import tensorflow as tf

    from trainvitals.agent import tf_env, tf_vitals
    from trainvitals.agent.ring import DeviceRing

    model, x_all, y_all = build()
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    x, y = tf.constant(x_all[:batch]), tf.constant(y_all[:batch])
    variables = model.trainable_variables

    mse = tf_env.regression_loss(regression())

    def into_ring(chance: bool = False) -> Callable[[Any, Any], Any]:
        rings: list[DeviceRing] = []  # one per instance, made at its trace

        def output(loss: Any, grads: Any) -> Any:
            vector = tf_vitals.step_vitals(loss, (x, y), grads)
            if chance:  # a regression's level on the batch's targets, one more in the row
                level = tf_env.chance_of_regression(mse, (x, y))
                vector = tf.concat([vector, tf.reshape(level, [1])], 0)
            if not rings:
                rings.append(DeviceRing(int(vector.shape[0])))
            rings[0].write(vector)
            return loss

        return output

    def compiled(output: Callable[[Any, Any], Any]) -> Callable[[], Any]:
        def step() -> Any:
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
            grads = tape.gradient(loss, variables)
            model.optimizer.apply(grads, variables)
            return output(loss, grads)

        traced: Callable[[], Any] = tf.function(step)
        return traced

    variants: dict[str, Callable[[], Callable[[Any, Any], Any]]] = {
        "bare": lambda: lambda loss, grads: loss,
        # What the callback's step adds: the vitals written into the device ring, nothing
        # more fetched than the bare step's loss.
        "ring": into_ring,
        # The same, and a regression's loss at chance on the batch's targets (the labels here,
        # read as numbers: the same two loss evaluations on a batch of that size).
        "chance": lambda: into_ring(chance=True),
        # The same vitals fetched as a vector instead.
        "vitals": lambda: lambda loss, grads: tf_vitals.step_vitals(loss, (x, y), grads),
        # Only what no design that reports every step's gradient norms can leave out: each
        # gradient read once for its sum of squares.
        "squares": lambda: (
            lambda loss, grads: tf.concat(
                [tf.reshape(loss, [1]), tf_vitals.squared_norms(grads)], 0
            )
        ),
    }
    # Traces made later run faster: three traces of the very bare step made after the first
    # three read 8-13 µs less on the MLP. Made variant by variant, bare first, every variant
    # looked that much cheaper; made in a shuffled order, none does.
    order = [(name, i) for i in range(instances) for name in variants]
    random.shuffle(order)
    steps = [(name, i, compiled(variants[name]())) for name, i in order]
    seconds: dict[tuple[str, int], list[float]] = {(name, i): [] for name, i, _ in steps}
    for round_ in range(pairs + 20):
        shift = round_ % len(steps)
        for name, i, step in steps[shift:] + steps[:shift]:
            start = time.perf_counter()
            np.asarray(step())  # fetched, as fit fetches its logs
            if round_ >= 20:  # tracing and warm-up left out
                seconds[name, i].append(time.perf_counter() - start)
    base = [
        statistics.fmean(t)
        for t in zip(*(seconds["bare", i] for i in range(instances)), strict=True)
    ]

    def each(name: str) -> list[float]:
        return [
            statistics.median(t - b for t, b in zip(seconds[name, i], base, strict=True))
            for i in range(instances)
        ]

    return {"bare": statistics.median(base), "each": {name: each(name) for name in variants}}


def in_step_summary(processes: list[dict[str, Any]], pairs: int) -> tuple[str, float, float]:
    """The in-step figures of several processes (:func:`in_step_cost`'s): the text, and the
    vitals written into the ring, seconds added a step and its ± 2 standard errors. A
    variant's figure is the mean of its instances in each process, then the mean of the
    processes; its error is across the processes (whose differences include the instances')."""

    def per_process(name: str) -> list[float]:
        # Less the bare instances' own figure (a median against a mean is not quite 0).
        return [
            statistics.fmean(found["each"][name]) - statistics.fmean(found["each"]["bare"])
            for found in processes
        ]

    def interval(name: str) -> tuple[float, float]:
        means = per_process(name)
        spread = 2 * statistics.stdev(means) / len(means) ** 0.5 if len(means) > 1 else math.inf
        return statistics.fmean(means), spread

    bare = statistics.median(found["bare"] for found in processes) * 1e6
    ring, ring_se = interval("ring")
    # The level's own cost: against the ring variant of the same process.
    on_top = [c - r for c, r in zip(per_process("chance"), per_process("ring"), strict=True)]
    chance = statistics.fmean(on_top)
    chance_se = 2 * statistics.stdev(on_top) / len(on_top) ** 0.5 if len(on_top) > 1 else math.inf
    instances = len(processes[0]["each"]["bare"])
    floor = statistics.fmean(statistics.stdev(found["each"]["bare"]) for found in processes)
    text = (
        f"compiled step {bare:.0f} µs bare, {ring * 1e6:+.0f} ± {ring_se * 1e6:.0f} µs with the "
        f"in-step vitals written into the device ring ({1 + ring * 1e6 / bare:.4f}x; "
        f"{len(processes)} processes, {instances} traces of each variant, {pairs} rounds; "
        f"by process {' '.join(f'{m * 1e6:+.0f}' for m in per_process('ring'))}; "
        f"{interval('vitals')[0] * 1e6:+.0f} µs fetched as a vector instead), of which every "
        f"gradient's sum of squares alone {interval('squares')[0] * 1e6:+.0f} µs; a "
        f"regression's loss at chance on top {chance * 1e6:+.0f} ± {chance_se * 1e6:.0f} µs; "
        f"one trace of the bare step from another: {floor * 1e6:.0f} µs (standard deviation)"
    )
    return text, ring, ring_se


def hook_cost(server_url: str, steps: int) -> tuple[str, float]:
    """The callback's per-step work on the training thread alone: ``on_train_batch_begin`` and
    ``on_train_batch_end`` called as Keras calls them, with the device ring in place, so the
    hooks note the clock and the step (the ring's reads, every flush interval, are the sender
    thread's CPU, counted with it in ``fit``). CPU time of this thread, the lowest of 5 blocks:
    no train step runs in between, so nothing else is timed."""
    from trainvitals.agent import packing
    from trainvitals.agent.ring import DeviceRing

    model, _, _ = mlp()
    model.compile(optimizer="adam", loss="mse")
    callback = trainvitals.VitalsCallback(
        server=server_url, project="bench", run_name="hooks", flush_interval=3600
    )
    callback.set_model(model)
    callback.set_params({"epochs": 1, "steps": 5 * steps})
    callback.on_train_begin()
    tap = callback._tap
    assert tap is not None
    tap.ring = DeviceRing(len(packing.HEAD) + len(model.trainable_variables))
    step = 0

    def block(work: Callable[[int], None]) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.thread_time()
            for i in range(steps):
                work(i)
            best = min(best, (time.thread_time() - start) / steps)
        return best

    ring = tap.ring

    def hooks(_: int) -> None:
        nonlocal step
        callback.on_train_batch_begin(step)
        callback.on_train_batch_end(step, {"accuracy": 0.5, "loss": 0.7})
        step += 1
        ring.read_upto = step  # as if the sender thread had read: its reads are its CPU

    try:
        seconds = block(hooks)
    finally:
        callback.on_train_end()
    return f"{seconds * 1e6:.1f} µs CPU a step: the callback's two hooks", seconds


class _GatedEvent(threading.Event):
    """The sender's wake-up event, whose waits first wait for the gate to open."""

    def __init__(self, gate: threading.Event, was_set: bool) -> None:
        super().__init__()
        self._gate = gate
        if was_set:
            self.set()

    def wait(self, timeout: float | None = None) -> bool:
        self._gate.wait()
        return super().wait(timeout)


class WindowGate(keras.callbacks.Callback):  # type: ignore[misc]
    """Alternates the agent's background work on and off in windows of ``window`` seconds
    within one ``fit``, and times the steps of each window.

    Off, the gate holds the agent's sender and sampler threads in their waits (their work
    waits for the next on window: the server then has nothing to judge either); the train
    step keeps writing the device ring (a window holds far fewer steps than half the ring, so
    the training thread never reads it for them). Each pair of adjacent windows, in an order
    drawn at random, gives one ratio on / off: the machine's drift over a second cancels out
    of it, which it does not between two processes a minute apart. ``load``: instead of the
    agent, a thread of this process that burns ``load`` seconds of CPU outside the GIL (or,
    ``holding_gil``, in Python) every 0.2 s in on windows: the known cost that shows what the
    measurement resolves.

    The first callback of the list (its ``on_train_end`` opens the gate before the agent's
    closes the run); the agent's threads are gated at the first step, once they exist.
    """

    async_safe = False

    def __init__(
        self,
        window: float,
        warmup: int,
        seconds: float,
        load: float = 0.0,
        holding_gil: bool = False,
    ) -> None:
        super().__init__()
        self.window, self.warmup, self.seconds, self.load = window, warmup, seconds, load
        #: The control's load burns in Python, holding the GIL (as the sender's packing does).
        self.holding_gil = holding_gil
        self.gate = threading.Event()
        self.gate.set()
        self.vitals: Any = None  # the VitalsCallback whose threads are gated
        self.order = np.random.default_rng(0).integers(0, 2, size=100_000)
        self.sums: dict[int, list[float]] = {}  # window -> [seconds, steps]
        self.started = 0.0
        self.last: tuple[float, int] | None = None  # the last step's start and window
        self._burning = threading.Event()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        if batch < self.warmup:
            return
        if batch == self.warmup:
            self.started = now
            self._gate_agent()
        if self.last is not None:
            start, window = self.last
            totals = self.sums.setdefault(window, [0.0, 0])
            totals[0] += now - start
            totals[1] += 1
        window = int((now - self.started) / self.window)
        if self._on(window):
            self.gate.set()
        else:
            self.gate.clear()
        self.last = (now, window)
        if now - self.started >= self.seconds:
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._burning.set()
        self.gate.set()

    def _on(self, window: int) -> bool:
        return bool(self.order[window // 2] == window % 2)

    def _gate_agent(self) -> None:
        if self.load > 0:
            threading.Thread(target=self._burn, daemon=True).start()
            return
        run = self.vitals.run
        sender, sampler = run._sender, run._sampler
        sender._wake = _GatedEvent(self.gate, sender._wake.is_set())
        if sampler is not None:
            wait = sampler._wait

            def gated(timeout: float) -> bool:
                self.gate.wait()
                return bool(wait(timeout))

            sampler._wait = gated

    def _burn(self) -> None:
        import hashlib

        block = bytes(1 << 20)
        due = time.monotonic()
        while not self._burning.is_set():
            self.gate.wait()
            end = time.thread_time() + self.load
            while time.thread_time() < end:
                if self.holding_gil:
                    sum(range(1000))
                else:
                    hashlib.sha256(block).digest()  # outside the GIL
            due += 0.2
            self._burning.wait(max(0.0, due - time.monotonic()))

    def ratios(self) -> list[float]:
        """Each complete pair's mean step on / mean step off."""
        out = []
        for pair in range(max(self.sums, default=-1) // 2 + 1):
            on, off = (2 * pair, 2 * pair + 1) if self._on(2 * pair) else (2 * pair + 1, 2 * pair)
            a, b = self.sums.get(on), self.sums.get(off)
            if a and b and a[1] >= 3 and b[1] >= 3:
                out.append((a[0] / a[1]) / (b[0] / b[1]))
        return out


def traced(model_name: str, batch: int, warmup: int) -> tuple[Any, Any]:
    """A fresh process's model, compiled, and its endless dataset at ``batch``, with the bare
    step traced by a short fit (so no configuration's time includes that tracing)."""
    import tensorflow as tf

    model, x, y = MODELS[model_name]()
    model.compile(
        optimizer="adam",
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    n = min(len(x), 100 * batch)
    data = tf.data.Dataset.from_tensor_slices((x[:n], y[:n])).batch(batch, drop_remainder=True)
    data = data.repeat()
    fit_steps(model, data, warmup + 10, warmup, [])
    return model, data


def child(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """This script run in a fresh process with ``argv``; the JSON line it prints last."""
    import json
    import subprocess

    command = [sys.executable, __file__, *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def windowed(model_name: str, mode: str, seconds: float, batch: int, url: str) -> None:
    """One ``fit`` with the agent's background work switched on and off in alternate windows
    (``--windowed``); prints one JSON line: the pairs' ratios."""
    if re.fullmatch(r"agent(@[0-9.]+)?|control(-gil)?", mode) is None:
        raise SystemExit(f"unknown within-fit mode {mode!r}: agent[@SECONDS], control[-gil]")
    import json

    warmup = 200
    model, data = traced(model_name, batch, warmup)
    control = mode.startswith("control")
    gate = WindowGate(
        WINDOW, warmup, seconds, load=LOAD if control else 0.0, holding_gil=mode == "control-gil"
    )
    extra: list[Any] = [gate]
    if mode.startswith("agent"):  # "agent@0.2": sending five times a second instead
        interval = mode.partition("@")[2]
        gate.vitals = trainvitals.VitalsCallback(
            server=url,
            project="bench",
            run_name="windows",
            flush_interval=float(interval) if interval else DEFAULT_FLUSH_INTERVAL,
        )
        extra.append(gate.vitals)
    model.fit(data, steps_per_epoch=10**9, epochs=1, verbose=0, callbacks=extra)
    print(json.dumps({"ratios": gate.ratios()}), flush=True)


#: The windows of the within-fit measurement (seconds): two read intervals, and fewer steps
#: of a 1 ms MLP step than half the ring (the training thread's own read). A send, once a
#: second, waits for an on window, so it falls in every second or third of them.
WINDOW = 0.4
#: The control's known load: CPU seconds burnt every 0.2 s in on windows (10 ms a second,
#: about what the agent's sender and a server on the same cores take together).
LOAD = 0.002


#: The fit-level configurations, alternated round by round.
CONFIGS = ("bare", "VitalsCallback", "TensorBoard(batch)")
#: The budgets of the fit-level ratio to bare: the ~2 ms MLP, and a step of 10 ms or more.
BUDGET_SMALL, BUDGET_LARGE = 1.04, 1.01


def worker(model_name: str, config: str, steps: int, warmup: int, batch: int, url: str) -> None:
    """One fit in a fresh process (``--worker``): build, trace with a short bare fit, then
    ``steps`` steps with ``config``; prints one JSON line: seconds a step after ``warmup``,
    and CPU a step by kind of thread."""
    import json

    model, data = traced(model_name, batch, warmup)
    server_pid = int(os.environ.get("BENCH_SERVER_PID", "0"))
    extra: list[Any] = []
    if config == "VitalsCallback":
        extra = [trainvitals.VitalsCallback(server=url, project="bench", run_name=model_name)]
    elif config == "TensorBoard(batch)":
        log_dir = tempfile.mkdtemp(prefix="tb-")
        extra = [keras.callbacks.TensorBoard(log_dir=log_dir, update_freq="batch")]
    probe = CpuProbe(warmup, server_pid)
    seconds = fit_steps(model, data, steps, warmup, [probe, *extra])
    agent = str(Path(trainvitals.__file__).resolve().parent.parent)  # which checkout ran
    print(json.dumps({"seconds": seconds, "cpu": probe.per_step, "agent": agent}), flush=True)


def fit_steps(model: Any, data: Any, steps: int, warmup: int, extra: list[Any]) -> float:
    timer = StepTimer(warmup)  # first, so the end-of-training flush is not counted as steps
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer, *extra])
    return timer.seconds_per_step


def fresh_fit(
    model_name: str, config: str, args: argparse.Namespace, server: ServerProcess
) -> dict[str, Any]:
    batch = batch_of(model_name, args)
    env = {**os.environ, "BENCH_SERVER_PID": str(server.process.pid)}
    return child("--worker", model_name, config, str(args.steps), str(args.warmup), str(batch),
                 server.url, env=env)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument(
        "--cnn-batch", type=int, default=384, help="the larger step's batch (10 ms or more)"
    )
    parser.add_argument("--pairs", type=int, default=500, help="rounds of the in-step measurement")
    parser.add_argument(
        "--instances", type=int, default=4, help="traces of each variant of the in-step step"
    )
    parser.add_argument(
        "--in-step-processes", type=int, default=3, help="of the in-step measurement"
    )
    parser.add_argument(
        "--in-step-only", action="store_true", help="measure the in-step vitals, nothing else"
    )
    parser.add_argument("--hook-steps", type=int, default=5000, help="of the hooks' measurement")
    parser.add_argument(
        "--windowed-seconds",
        type=float,
        default=60.0,
        help="of each fit of the within-fit measurement (0: none)",
    )
    parser.add_argument(
        "--windowed-extra",
        nargs="*",
        default=[],
        metavar="MODE",
        help="more within-fit rows: agent@SECONDS (another flush interval), control-gil "
        "(the known load burnt in Python, holding the GIL)",
    )
    parser.add_argument("--windowed-models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--against",
        metavar="REF",
        help="compare this checkout's VitalsCallback with git REF's (and measure nothing else)",
    )
    parser.add_argument("--against-models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--windowed", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--in-step", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, config, steps, warmup, batch, url = args.worker
        worker(name, config, int(steps), int(warmup), int(batch), url)
        return
    if args.windowed:
        name, mode, seconds, batch, url = args.windowed
        windowed(name, mode, float(seconds), int(batch), url)
        return
    if args.in_step:
        import json

        name, pairs, batch, instances = args.in_step
        cost = in_step_cost(MODELS[name], int(pairs), int(batch), int(instances))
        print(json.dumps(cost), flush=True)
        return
    if args.against:
        against(args)
        return
    print("in-step vitals, paired step by step:")
    in_step: dict[str, float] = {}
    in_step_se: dict[str, float] = {}
    for name in ("MLP", "CNN"):
        batch = batch_of(name, args)  # the batch its fit runs at
        found = [
            child("--in-step", name, str(args.pairs), str(batch), str(args.instances))
            for _ in range(args.in_step_processes)
        ]
        text, in_step[name], in_step_se[name] = in_step_summary(found, args.pairs)
        print(f"  {name} (batch {batch}): {text}", flush=True)
    print()
    if args.in_step_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "bench.db"))
        try:
            text, hooks = hook_cost(server.url, args.hook_steps)
            print(f"per-step work on the training thread: {text}\n", flush=True)
            print(
                f"fit, a fresh process per run, {args.rounds} alternated rounds of {args.steps} "
                f"steps (first {args.warmup} left out), the server on the same cores; ratio = "
                "vs the bare run of the same round"
            )
            cpu_rows: list[tuple[str, dict[str, float], dict[str, float]]] = []
            bare_step: dict[str, float] = {}
            for name in ("MLP", "CNN"):
                times: dict[str, list[float]] = {c: [] for c in CONFIGS}
                cpu: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
                for round_ in range(args.rounds):
                    for config in CONFIGS[round_ % 3 :] + CONFIGS[: round_ % 3]:
                        result = fresh_fit(name, config, args, server)
                        times[config].append(result["seconds"])
                        cpu[config].append(result["cpu"])
                bare = statistics.median(times["bare"])
                bare_step[name] = bare
                batch = batch_of(name, args)
                print(f"\n{name} at batch {batch}: bare {bare * 1e3:.2f} ms a step (median)")
                added: dict[str, float] = {}
                for config in CONFIGS[1:]:
                    ratios = [t / b for t, b in zip(times[config], times["bare"], strict=True)]
                    median = statistics.median(ratios)
                    added[config] = (median - 1) * bare
                    rounds = " ".join(f"{r:.3f}" for r in ratios)
                    print(
                        f"  {config:<20} {median:.3f}x [{min(ratios):.3f}-{max(ratios):.3f}] "
                        f"{added[config] * 1e6:+.0f} µs a step; rounds: {rounds}"
                    )
                budget = BUDGET_SMALL if bare < 0.01 else BUDGET_LARGE
                vitals, board = added["VitalsCallback"], added["TensorBoard(batch)"]
                ratio = 1 + vitals / bare
                print(
                    f"  budget {budget:.2f}x ({'≥ 10 ms' if bare >= 0.01 else '~2 ms'} step): "
                    f"{'met' if ratio <= budget else 'NOT met'} ({ratio:.3f}x); VitalsCallback "
                    f"adds {vitals / board if board > 0 else float('nan'):.2f} of what "
                    "TensorBoard(batch) adds (budget < 0.5)",
                    flush=True,
                )
                cpu_rows.append(
                    (name, _median_by_kind(cpu["bare"]), _median_by_kind(cpu["VitalsCallback"]))
                )
            for name, bare_cpu, vitals_cpu in cpu_rows:
                print(
                    f"\n{name}: CPU µs per step by thread (median of rounds): "
                    "bare, VitalsCallback, added"
                )
                for kind in sorted(set(bare_cpu) | set(vitals_cpu)):
                    b, v = bare_cpu.get(kind, 0.0) * 1e6, vitals_cpu.get(kind, 0.0) * 1e6
                    print(f"  {kind:<30} {b:>8.1f} {v:>8.1f} {v - b:>+8.1f}")
            print(
                "\nThe agent's cost a step, added up from the steady measurements above (the "
                "in-step vitals paired, the hooks, the agent's own threads' CPU)"
            )
            for name, bare_cpu, vitals_cpu in cpu_rows:
                threads = sum(
                    v - bare_cpu.get(k, 0.0)
                    for k, v in vitals_cpu.items()
                    if k.startswith("trainvitals-")
                )
                server_cpu = vitals_cpu.get("server process", 0.0) - bare_cpu.get(
                    "server process", 0.0
                )
                total = in_step[name] + hooks + threads
                print(
                    f"  {name}: {total * 1e6:.0f} µs (in-step "
                    f"{in_step[name] * 1e6:.0f}, hooks {hooks * 1e6:.0f}, threads "
                    f"{threads * 1e6:.0f}) against its {bare_step[name] * 1e3:.2f} ms fit step; "
                    f"a server on the same cores adds {server_cpu * 1e6:.0f} µs of CPU a step."
                )
            if args.windowed_seconds > 0:
                within_fit(args, server, in_step, in_step_se, hooks, bare_step)
        finally:
            server.stop()


def within_fit(
    args: argparse.Namespace,
    server: ServerProcess,
    in_step: dict[str, float],
    in_step_se: dict[str, float],
    hooks: float,
    bare_step: dict[str, float],
) -> None:
    """The agent's background work (sender, sampler, and the server it keeps busy) on and
    off in alternate windows of one fit, beside the same for a known load; then the agent's
    whole cost as the in-step vitals (paired) and hooks times that ratio, against the
    budgets."""
    print(
        f"\nwithin one fit of {args.windowed_seconds:.0f} s: the agent's background work "
        f"(sender, sampler, the server on the same cores) on and off in alternate "
        f"{WINDOW} s windows, each pair's ratio on/off, median [quartiles], mean ± 2 "
        f"standard errors; the control: {LOAD * 5e3:.0f} ms a second of CPU burnt outside "
        "the GIL in its on windows, in place of the agent"
    )
    for name in args.windowed_models:
        batch = batch_of(name, args)
        found: dict[str, tuple[float, float]] = {}
        for mode in ("agent", "control", *args.windowed_extra):
            ratios = child("--windowed", name, mode, str(args.windowed_seconds), str(batch),
                           server.url)["ratios"]  # fmt: skip
            low, _, high = statistics.quantiles(ratios, n=4)
            mean = statistics.fmean(ratios)
            spread = 2 * statistics.stdev(ratios) / len(ratios) ** 0.5
            found[mode] = (mean, spread)
            print(
                f"  {name} {mode:<11} {statistics.median(ratios):.3f}x [{low:.3f}-{high:.3f}], "
                f"mean {mean:.4f} ± {spread:.4f} ({len(ratios)} pairs)",
                flush=True,
            )
        mean, spread = found["agent"]
        step = 1 + (in_step[name] + hooks) / bare_step[name]
        step_spread = in_step_se[name] / bare_step[name]
        # Both intervals at once: the in-step vitals' (across traces) and the background's.
        low = (step - step_spread) * (mean - spread)
        high = (step + step_spread) * (mean + spread)
        whole, budget = step * mean, BUDGET_SMALL if bare_step[name] < 0.01 else BUDGET_LARGE
        verdict = "met" if high <= budget else "NOT met" if low > budget else "not resolved"
        print(
            f"  {name}: in-step vitals and hooks {step:.4f}x ± {step_spread:.4f} x background "
            f"{mean:.4f}x ± {spread:.4f} = {whole:.4f}x [{low:.4f}-{high:.4f}]; "
            f"budget {budget:.2f}x: {verdict}",
            flush=True,
        )


def against(args: argparse.Namespace) -> None:
    """This checkout's VitalsCallback against git ``args.against``'s, alternated in fresh
    processes (the order swapped each round) on one server: step time and the agent's CPU."""
    here = str(ROOT / "src")
    with tempfile.TemporaryDirectory() as tmp, git_worktree(args.against) as tree:
        server = ServerProcess(str(Path(tmp) / "bench.db"))
        try:
            print(
                f"VitalsCallback at this checkout vs at {args.against}, {args.rounds} "
                f"alternated rounds of {args.steps} steps, fresh processes, one server"
            )
            for name in args.against_models:
                results: dict[str, list[dict[str, Any]]] = {"this": [], "ref": []}
                for round_ in range(args.rounds):
                    for which in ("this", "ref") if round_ % 2 == 0 else ("ref", "this"):
                        env = {**os.environ, "BENCH_SERVER_PID": str(server.process.pid)}
                        env["PYTHONPATH"] = here if which == "this" else str(tree / "src")
                        result = child("--worker", name, "VitalsCallback", str(args.steps),
                                       str(args.warmup), str(batch_of(name, args)), server.url,
                                       env=env)  # fmt: skip
                        expected = here if which == "this" else str((tree / "src").resolve())
                        if result["agent"] != expected:
                            raise RuntimeError(f"{which} ran the agent at {result['agent']}")
                        results[which].append(result)
                ratios = [
                    a["seconds"] / b["seconds"]
                    for a, b in zip(results["this"], results["ref"], strict=True)
                ]
                print(
                    f"\n{name}: step time, this / {args.against}: "
                    f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]; "
                    f"rounds: {' '.join(f'{r:.3f}' for r in ratios)}"
                )
                this = _median_by_kind([r["cpu"] for r in results["this"]])
                ref = _median_by_kind([r["cpu"] for r in results["ref"]])
                print(f"  CPU µs a step by thread (median of rounds): {args.against}, this, ratio")
                for kind in sorted(set(this) | set(ref)):
                    a, b = ref.get(kind, 0.0) * 1e6, this.get(kind, 0.0) * 1e6
                    ratio = f"{b / a:.3f}x" if a > 0 else "-"
                    print(f"    {kind:<30} {a:>8.1f} {b:>8.1f} {ratio:>8}", flush=True)
        finally:
            server.stop()


def batch_of(name: str, args: argparse.Namespace) -> int:
    """The batch ``name``'s fits run at: the MLP's fixed one, the CNN's ``--cnn-batch``."""
    return BATCH if name == "MLP" else int(args.cnn_batch)


def _median_by_kind(samples: list[dict[str, float]]) -> dict[str, float]:
    kinds = {kind for sample in samples for kind in sample}
    return {k: statistics.median(sample.get(k, 0.0) for sample in samples) for k in kinds}


if __name__ == "__main__":
    main()
