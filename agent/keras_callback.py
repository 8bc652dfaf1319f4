"""``VitalsCallback``: stream a ``model.fit`` run to a trainvitals server.

This module imports Keras; ``trainvitals/__init__.py`` loads it only when
``trainvitals.VitalsCallback`` is first used, so ``import trainvitals`` stays light.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import keras
from trainvitals import tf_vitals
from trainvitals.config import resolve
from trainvitals.protect import Guard, Protection
from trainvitals.protocol import END_COMPLETED
from trainvitals.run import Run
from trainvitals.sampler import Source
from trainvitals.vitals import StepVitals, healthy, variable_norms

log = logging.getLogger("trainvitals")

# Vitals computed in the train step ride along with the logs Keras already fetches from the
# device, under these keys; the callback takes them out before Progbar or History see them.
_VITALS = "trainvitals/vitals"  # one float32 vector: see tf_vitals.step_vitals


class VitalsCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Stream every training step's vitals to a trainvitals server.

    Per step, computed inside the compiled train step and fetched with the logs Keras already
    brings to the host: the loss of that very batch (not Keras's running mean), the gradients'
    global norm, NaN/Inf counts of the loss, the gradients and the input batch; and the step
    time and every metric Keras logs. Per-variable gradient norms every ``grad_norms_every``
    steps and on any step whose gradients are non-finite or jump tenfold. NaN/Inf in the
    weights every ``weights_every`` steps. Per second, host and GPU memory, utilisation,
    temperature, power and throttling (see ``system_metrics``). Per epoch, validation values.

    Recording is a list append: a background thread sends, and an unreachable server costs
    one warning, never an exception or a slower step. The callback is ``async_safe``, so it
    does not make Keras wait for each step's results.

    Args:
        server: base URL of the server, e.g. ``"http://10.0.0.5:8600"``. Default:
            ``$TRAINVITALS_SERVER``, else ``http://127.0.0.1:8600``.
        project: groups runs. Default: ``$TRAINVITALS_PROJECT``, else ``"default"``.
        run_name: shown in the dashboard; generated when not given.
        token: bearer token for the server. Default: ``$TRAINVITALS_TOKEN``.
        config: hyper-parameters to show with the run (``fit``'s epochs and steps are added).
        flush_interval: seconds between sends (default 0.2).
        grad_norms_every: steps between per-variable gradient norms (default 10).
        weights_every: steps between NaN/Inf checks of the weights (default 50; 0: never).
        system_metrics: seconds between host/GPU samples (default 1; 0 or False: off).
        gpu: a GPU source instead of NVML, e.g. ``trainvitals.SimulatedGpu(...)``.
        watchdog: start a small watchdog process that reports a SIGKILL, an OOM kill or a
            segfault, which the training process cannot report itself (default True).
        protect: protective actions the callback takes by itself (see
            :class:`trainvitals.Protection`): stop at the first NaN/Inf and restore the last
            finite weights; save the weights when memory is about to run out. Off by default.

    The first step with a NaN/Inf also gets an autopsy (:mod:`trainvitals.autopsy`): which
    origin, which variables' gradients overflowed or rose most, which layers' weights are
    poisoned. It joins the server's ``nonfinite`` alert.

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
        grad_norms_every: int = 10,
        weights_every: int = 50,
        system_metrics: float | bool = 1.0,
        gpu: Source | None = None,
        watchdog: bool = True,
        protect: Protection | None = None,
    ) -> None:
        super().__init__()
        self._protect = protect
        self.guard: Guard | None = None
        self._autopsied = False
        self._healthy_norms: dict[str, float] = {}
        self._autopsy_lock = threading.Lock()
        self._settings = resolve(server, project, run_name, token, config, flush_interval)
        self._vitals = StepVitals(grad_norms_every)
        self._weights_every = int(weights_every)
        self._system_metrics = system_metrics
        self._gpu = gpu
        self._watchdog = watchdog
        self.run: Run | None = None
        self._epoch_first_step = 0
        self._batch_began: tuple[int, float] | None = None
        self._grad_names: list[str] = []
        self._has_loss = self._has_grads = False  # what the traced step could measure
        self._undo: list[Callable[[], None]] = []

    # Keras may call on_train_batch_end from a thread pool, several at once and out of order:
    # that hook only reads the logs it is given and appends to the (locked) buffer.
    async_safe = True

    # -- Keras hooks --------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        params = {k: v for k, v in (self.params or {}).items() if k in ("epochs", "steps")}
        self.guard = Guard(self._protect, self.model) if self._protect is not None else None
        self._autopsied = False
        self.run = Run(
            replace(self._settings, config={**params, **self._settings.config}),
            system_metrics=self._system_metrics,
            gpu=self._gpu,
            env=_tensorflow_env(self.model),
            watchdog=self._watchdog,
            on_system=self.guard.on_system if self.guard is not None else None,
        )
        self.run.start()
        self._epoch_first_step = 0
        self._instrument()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.run is not None:
            self._epoch_first_step = self.run.last_step
        self._batch_began = None  # validation time is not step time

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras calls this on the training thread, in order, right before each execution,
        # so the time between two of them is the step time as training experiences it.
        if self.guard is not None:
            self.guard.before_step()
        now = time.perf_counter()
        began = self._batch_began
        self._batch_began = (batch, now)
        if began is not None and self.run is not None and batch > began[0]:
            step = self._epoch_first_step + batch  # the last step of the previous execution
            self.run.log(step, {"step_time": (now - began[1]) / (batch - began[0])})

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        packed = _take_vitals(logs)
        if self.run is None:
            return
        step = self._epoch_first_step + batch + 1  # global; `batch` restarts each epoch
        values = _numbers(logs)
        values.pop("loss", None)  # Keras's epoch running mean; "loss" is the batch's own
        if packed is not None:
            head, norms = tf_vitals.unpack(packed)
            values.update(
                self._vitals.values(
                    step,
                    head,
                    norms,
                    self._grad_names,
                    loss=self._has_loss,
                    inputs=True,
                    grads=self._has_grads,
                )
            )
        self.run.log(step, values)
        if self._weights_every and step % self._weights_every == 0:
            self.run.log(step, {"nonfinite/weights": tf_vitals.nonfinite_weights(self.model)})
        if packed is not None:
            self._after_step(step, values)

    def _after_step(self, step: int, values: dict[str, float]) -> None:
        """The autopsy of the first NaN/Inf step, and the protective actions."""
        if healthy(values):
            norms = variable_norms(values)
            if norms:
                self._healthy_norms = norms
            if self.guard is not None:
                self.guard.healthy_step(step)
            return
        with self._autopsy_lock:
            if self._autopsied:
                return
            self._autopsied = True
        try:
            from trainvitals import autopsy

            report = autopsy.from_vitals(self.model, values, self._healthy_norms)
        except Exception as exc:  # an autopsy must never break training
            report = {"error": f"{type(exc).__name__}: {exc}"}
        if self.guard is not None:
            action = self.guard.nonfinite_step(step)
            if action is not None:
                report["action"] = action
        log.warning("trainvitals: NaN/Inf at step %d: %s", step, report.get("verdict", report))
        if self.run is not None:
            self.run.report_autopsy(step, report)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        _take_vitals(logs)
        values = _numbers(logs)
        epoch_values = {k if k.startswith("val_") else f"epoch/{k}": v for k, v in values.items()}
        epoch_values["epoch"] = epoch + 1
        if self.run is not None:
            self.run.log(self.run.last_step, epoch_values)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        _take_vitals(logs)
        self._uninstrument()
        if self.guard is not None:
            self.guard.at_end()
        if self.run is not None:
            self.run.finish(END_COMPLETED)

    # -- per-step vitals ----------------------------------------------------------------------

    # -- the hook inside the train step ------------------------------------------------------

    def _instrument(self) -> None:
        """Make the compiled train step also return the vitals.

        ``compute_loss``, ``train_step`` and the optimizer's ``apply`` are wrapped on the
        instances before the train function is traced, so the values come back with the logs
        Keras fetches anyway: no extra device-to-host transfer per step.
        """
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        try:
            captured: dict[str, Any] = {}
            compute_loss, train_step = model.compute_loss, model.train_step

            @functools.wraps(compute_loss)
            def capturing_compute_loss(*args: Any, **kwargs: Any) -> Any:
                captured["loss"] = loss = compute_loss(*args, **kwargs)
                return loss

            @functools.wraps(train_step)
            def reporting_train_step(data: Any, *args: Any, **kwargs: Any) -> Any:
                captured.clear()
                logs = train_step(data, *args, **kwargs)
                # Python runs here once, while the step is traced: these say what it measures.
                self._has_loss, self._has_grads = "loss" in captured, "grads" in captured
                if isinstance(logs, dict):
                    vitals = tf_vitals.step_vitals(
                        captured.get("loss"),
                        data,
                        captured.get("grads"),
                        captured.get("scale"),
                    )
                    logs = {**logs, _VITALS: vitals}
                return logs

            undo = [
                self._wrap(model, "compute_loss", capturing_compute_loss),
                self._wrap(model, "train_step", reporting_train_step),
            ]
            if optimizer is not None:
                apply = optimizer.apply

                @functools.wraps(apply)
                def measuring_apply(grads: Any, trainable_variables: Any = None) -> Any:
                    grads = list(grads)
                    variables = (
                        list(trainable_variables)
                        if trainable_variables is not None
                        else list(optimizer._trainable_variables)
                    )
                    self._grad_names = [
                        tf_vitals.variable_name(v, i) for i, v in enumerate(variables)
                    ]
                    captured["grads"] = grads
                    captured["scale"] = tf_vitals.loss_scale_of(optimizer)
                    return apply(grads, trainable_variables)

                undo.append(self._wrap(optimizer, "apply", measuring_apply))
            self._undo = undo
            model.make_train_function(force=True)
        except Exception as exc:  # an unusual model must still train
            log.warning(
                "trainvitals: in-step vitals unavailable for this model (%s: %s)",
                type(exc).__name__,
                exc,
            )
            self._uninstrument()

    @staticmethod
    def _wrap(obj: object, name: str, function: Callable[..., Any]) -> Callable[[], None]:
        # Bypass Keras's attribute tracking: these are plain functions, not layers or variables.
        object.__setattr__(obj, name, function)
        return lambda: vars(obj).pop(name, None)

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
            continue  # strings or arrays some callbacks put in logs
    return out


def _take_vitals(logs: dict[str, Any] | None) -> Any:
    """Remove the step's packed vitals from Keras's logs (before Progbar or History see them)."""
    return None if logs is None else logs.pop(_VITALS, None)


def _tensorflow_env(model: Any) -> dict[str, Any]:
    try:
        return tf_vitals.describe(model)
    except Exception as exc:  # facts for the dashboard, never a reason to fail
        return {"tensorflow_describe_error": f"{type(exc).__name__}: {exc}"}
