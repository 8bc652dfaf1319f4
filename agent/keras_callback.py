"""``VitalsCallback``: stream a ``model.fit`` run to a trainvitals server.

This module imports Keras; ``trainvitals/__init__.py`` loads it only when
``trainvitals.VitalsCallback`` is first used, so ``import trainvitals`` stays light.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import keras
from trainvitals.config import resolve
from trainvitals.protocol import END_COMPLETED
from trainvitals.run import Run

log = logging.getLogger("trainvitals")

# The batch's own loss rides along with the logs Keras already fetches from the device each
# step, under this key; the callback takes it out before Progbar or History can see it.
_BATCH_LOSS = "trainvitals/batch_loss"


class VitalsCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Stream every training step's vitals to a trainvitals server.

    Per step it records the loss of that very batch (taken inside the compiled train step, not
    Keras's running mean), every metric Keras logs, and the step time; per epoch the
    validation values. Recording is a list append: a background thread does the sending, and
    an unreachable server costs one warning, never an exception or a slower step.

    Args:
        server: base URL of the server, e.g. ``"http://10.0.0.5:8600"``. Default:
            ``$TRAINVITALS_SERVER``, else ``http://127.0.0.1:8600``.
        project: groups runs. Default: ``$TRAINVITALS_PROJECT``, else ``"default"``.
        run_name: shown in the dashboard; generated when not given.
        token: bearer token for the server. Default: ``$TRAINVITALS_TOKEN``.
        config: hyper-parameters to show with the run (``fit``'s epochs, batch size and
            steps are added).
        flush_interval: seconds between sends (default 0.2).

    Example:
        ```python
        import trainvitals

        model.fit(x, y, epochs=5,
                  callbacks=[trainvitals.VitalsCallback(project="mnist", run_name="lr-3e-4")])
        ```
    """

    def __init__(
        self,
        server: str | None = None,
        project: str | None = None,
        run_name: str | None = None,
        token: str | None = None,
        config: dict[str, Any] | None = None,
        *,
        flush_interval: float = 0.2,
    ) -> None:
        super().__init__()
        self._settings = resolve(server, project, run_name, token, config, flush_interval)
        self.run: Run | None = None
        self._step = 0
        self._epoch_first_step = 0
        self._last_batch_end = 0.0
        self._undo: list[Callable[[], None]] = []

    # -- Keras hooks --------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        params = {k: v for k, v in (self.params or {}).items() if k in ("epochs", "steps")}
        self.run = Run(replace(self._settings, config={**params, **self._settings.config}))
        self.run.start()
        self._step = 0
        self._instrument()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_first_step = self._step
        self._last_batch_end = time.perf_counter()  # validation time is not step time

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        values = _numbers(logs)
        batch_loss = values.pop(_BATCH_LOSS, None)
        if logs is not None:
            logs.pop(_BATCH_LOSS, None)
        # Keras's "loss" is the epoch's running mean; the series "loss" is the batch's own.
        values.pop("loss", None)
        if batch_loss is not None:
            values["loss"] = batch_loss
        step = self._epoch_first_step + batch + 1  # global; `batch` restarts each epoch
        values["step_time"] = (now - self._last_batch_end) / max(step - self._step, 1)
        self._step, self._last_batch_end = step, now
        if self.run is not None:
            self.run.log(step, values)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        values = _numbers(logs)
        values.pop(_BATCH_LOSS, None)
        if logs is not None:
            logs.pop(_BATCH_LOSS, None)
        epoch_values = {k if k.startswith("val_") else f"epoch/{k}": v for k, v in values.items()}
        epoch_values["epoch"] = epoch + 1
        if self.run is not None:
            self.run.log(self._step, epoch_values)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs.pop(_BATCH_LOSS, None)
        self._uninstrument()
        if self.run is not None:
            self.run.finish(END_COMPLETED)

    # -- the hook inside the train step ------------------------------------------------------

    def _instrument(self) -> None:
        """Make the compiled train step also return the batch's loss.

        ``compute_loss`` and ``train_step`` are wrapped on the instance before the train
        function is traced, so the loss tensor comes back with the logs Keras fetches anyway:
        no extra device-to-host transfer per step.
        """
        model = self.model
        try:
            captured: dict[str, Any] = {}
            compute_loss = model.compute_loss
            train_step = model.train_step

            @functools.wraps(compute_loss)
            def capturing_compute_loss(*args: Any, **kwargs: Any) -> Any:
                loss = compute_loss(*args, **kwargs)
                captured["loss"] = loss
                return loss

            @functools.wraps(train_step)
            def reporting_train_step(*args: Any, **kwargs: Any) -> Any:
                captured.clear()
                logs = train_step(*args, **kwargs)
                if "loss" in captured and isinstance(logs, dict):
                    logs = {**logs, _BATCH_LOSS: captured["loss"]}
                return logs

            _set_instance_attr(model, "compute_loss", capturing_compute_loss)
            _set_instance_attr(model, "train_step", reporting_train_step)
            self._undo = [
                functools.partial(_del_instance_attr, model, "compute_loss"),
                functools.partial(_del_instance_attr, model, "train_step"),
            ]
            model.make_train_function(force=True)
        except Exception as exc:  # an unusual model must still train
            log.warning("trainvitals: cannot record the batch loss of this model (%s)", exc)
            self._uninstrument()

    def _uninstrument(self) -> None:
        undo, self._undo = self._undo, []
        for step in undo:
            step()
        if undo:
            # A later fit without this callback must not run the instrumented step.
            self.model.train_function = None


def _numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue  # strings or nested structures some callbacks put in logs
    return out


def _set_instance_attr(obj: object, name: str, value: Any) -> None:
    # Bypass Keras's attribute tracking: these are plain functions, not layers or variables.
    object.__setattr__(obj, name, value)


def _del_instance_attr(obj: object, name: str) -> None:
    vars(obj).pop(name, None)
