"""Time per training step: bare ``fit`` vs ``VitalsCallback`` (every vital on) vs Keras's
``TensorBoard(update_freq="batch")``, alternated in one run on a small MLP and a small CNN.

Each configuration runs the same model for ``--steps`` steps per round; the time from the
step after ``--warmup`` to the end of training is divided by the steps, so tracing (which
the callback's instrumentation redoes once per fit) and the watchdog process's start are left
out: both are once per run, not per step. Rounds rotate the order of
the three configurations; the medians are compared. The VitalsCallback streams to a real
server in another process, with the per-second sampler on.

    python benchmarks/agent_overhead.py [--rounds 9] [--steps 800] [--warmup 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras
import numpy as np
import trainvitals

from tests.helpers import ServerProcess

BATCH = 32


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "bench.db"))
        try:
            configs: dict[str, Callable[[], list[Any]]] = {
                "bare": lambda: [],
                "VitalsCallback": lambda: [
                    trainvitals.VitalsCallback(server=server.url, project="bench")
                ],
                "TensorBoard(batch)": lambda: [
                    keras.callbacks.TensorBoard(
                        log_dir=str(Path(tmp) / f"tb-{time.monotonic_ns()}"), update_freq="batch"
                    )
                ],
            }
            print(
                f"ms per step (median of {args.rounds} alternated rounds, {args.steps} steps, "
                f"first {args.warmup} left out); ratio = vs bare"
            )
            print(
                f"{'model':<6} {'bare ms':>8} {'VitalsCallback':>15} {'TensorBoard(batch)':>19}"
                f" {'added ms/step':>14}"
            )
            for name, build in (("MLP", mlp), ("CNN", cnn)):
                model, x, y = build()
                model.compile(
                    optimizer="adam",
                    metrics=["accuracy"],
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                )
                run_fit(model, x, y, args.warmup + 10, args.warmup, [])  # trace once
                times: dict[str, list[float]] = {c: [] for c in configs}
                order = list(configs)
                for round_ in range(args.rounds):
                    for config in order[round_ % 3 :] + order[: round_ % 3]:
                        times[config].append(
                            run_fit(model, x, y, args.steps, args.warmup, configs[config]())
                        )
                bare = statistics.median(times["bare"])
                vitals = statistics.median(times["VitalsCallback"]) / bare
                board = statistics.median(times["TensorBoard(batch)"]) / bare
                added = (vitals - 1) * bare * 1000
                print(
                    f"{name:<6} {bare * 1000:>8.2f} {vitals:>14.3f}x {board:>18.3f}x"
                    f" {added:>14.3f}",
                    flush=True,
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
