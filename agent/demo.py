"""``trainvitals demo``: a real small Keras training that streams to a server.

The data is scikit-learn's bundled 8x8 digits, so nothing is downloaded at run time.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
from sklearn.datasets import load_digits
from trainvitals.config import resolve
from trainvitals.keras_callback import VitalsCallback


class _Showcase(keras.callbacks.Callback):  # type: ignore[misc]
    """Prints the run's dashboard link and paces the steps so a person can watch them draw."""

    def __init__(self, vitals: VitalsCallback, server: str, pace: float) -> None:
        super().__init__()
        self._vitals, self._server, self._pace = vitals, server.rstrip("/"), pace

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._vitals.run is not None:
            print(f"Run dashboard: {self._server}/#/runs/{self._vitals.run.id}", flush=True)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._pace > 0:
            time.sleep(self._pace)


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits as (train, validation) image batches, shuffled reproducibly."""
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def build_model(learning_rate: float = 1e-3) -> keras.Model:
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


def run_demo(
    server: str | None = None,
    scenario: str = "healthy",
    project: str = "demo",
    run_name: str | None = None,
    epochs: int = 30,
    pace: float = 0.02,
    batch_size: int = 32,
) -> keras.callbacks.History:
    """Train the digits CNN with :class:`VitalsCallback` attached; returns Keras's History."""
    if scenario != "healthy":
        raise ValueError(f"Expected scenario 'healthy', but got {scenario!r}")
    settings = resolve(server=server, project=project, run_name=run_name)
    (x, y), validation = digits()
    model = build_model()
    vitals = VitalsCallback(
        server=settings.server,
        project=settings.project,
        run_name=settings.run_name,
        config={
            "scenario": scenario,
            "batch_size": batch_size,
            "learning_rate": 1e-3,
            "model": model.name,
            "dataset": "sklearn digits",
        },
    )
    return model.fit(
        x,
        y,
        validation_data=validation,
        epochs=epochs,
        batch_size=batch_size,
        callbacks=[vitals, _Showcase(vitals, settings.server, pace)],
        verbose=2,
    )
