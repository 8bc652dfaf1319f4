"""``trainvitals demo``: a real small Keras training that streams to a server.

The data is scikit-learn's bundled 8x8 digits, so nothing is downloaded at run time. The
scenarios (:mod:`trainvitals.demo.scenarios`) break the training in the familiar ways, each
showing its alert on the dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import keras

from trainvitals.agent.config import resolve
from trainvitals.agent.keras_callback import VitalsCallback
from trainvitals.demo.scenarios import SCENARIOS, Options
from trainvitals.exceptions import ConfigurationError


class _Showcase(keras.callbacks.Callback):  # type: ignore[misc]
    """Prints the run's dashboard link and paces the steps so a person can watch them draw."""

    def __init__(self, vitals: VitalsCallback, server: str, pace: float) -> None:
        super().__init__()
        self._vitals, self._server, self._pace = vitals, server.rstrip("/"), pace

    def on_train_begin(self, logs: Mapping[str, float] | None = None) -> None:
        if self._vitals.run is not None:
            print(f"Run dashboard: {self._server}/#/runs/{self._vitals.run.id}", flush=True)

    def on_train_batch_end(self, batch: int, logs: Mapping[str, float] | None = None) -> None:
        if self._pace > 0:
            time.sleep(self._pace)


def run_demo(
    server: str | None = None,
    scenario: str = "healthy",
    project: str = "demo",
    run_name: str | None = None,
    epochs: int = 30,
    pace: float = 0.02,
    time_to_oom: float = 180.0,
    hang_for: float = 90.0,
) -> keras.callbacks.History:
    """Train the scenario's model with :class:`VitalsCallback` attached; returns Keras's
    History."""
    if scenario not in SCENARIOS:
        raise ConfigurationError(
            f"Expected a scenario among {sorted(SCENARIOS)}, but got {scenario!r}"
        )
    settings = resolve(server=server, project=project, run_name=run_name)
    plan = SCENARIOS[scenario].plan(
        Options(epochs=epochs, time_to_oom=time_to_oom, hang_for=hang_for)
    )
    vitals = VitalsCallback(
        server=settings.server,
        project=settings.project,
        run_name=settings.run_name,
        config={"scenario": scenario, "model": plan.model.name, **plan.config},
        protect=plan.protect,
    )
    print(plan.story, flush=True)
    history = plan.model.fit(
        plan.x,
        plan.y,
        callbacks=[vitals, *plan.callbacks, _Showcase(vitals, settings.server, pace)],
        verbose=2,
        **plan.fit,
    )
    if vitals.guard is not None:
        for action in vitals.guard.actions:
            print(f"Protection: {action}", flush=True)
    return history
