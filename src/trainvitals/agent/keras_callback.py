"""``VitalsCallback``: stream a ``model.fit`` run to a trainvitals server.

This module imports Keras; ``trainvitals/__init__.py`` loads it only when
``trainvitals.VitalsCallback`` is first used, so ``import trainvitals`` stays light.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import keras
import numpy as np

from trainvitals.agent import tf_vitals
from trainvitals.agent.config import resolve
from trainvitals.agent.protect import Guard, Protection
from trainvitals.agent.run import Run
from trainvitals.agent.sampler import Source
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import END_COMPLETED, Columns, ListColumns
from trainvitals.series import (
    GRAD_GLOBAL_NORM,
    GRAD_NORM_PREFIX,
    LOSS,
    NONFINITE_GRADS,
    NONFINITE_INPUTS,
    NONFINITE_LOSS,
    NONFINITE_WEIGHTS,
    STEP_TIME,
)

log = logging.getLogger("trainvitals")

# Vitals computed in the train step ride along with the logs Keras already fetches from the
# device, under these keys; the callback takes them out before Progbar or History see them.
_VITALS = "trainvitals/vitals"  # one float32 vector: see tf_vitals.step_vitals

#: Steps collected before they become points all at once: per step, the callback only keeps
#: what Keras hands it; numpy turns a few dozen steps into columns in one go. A step with a
#: NaN/Inf is handled at once, and no step waits longer than half the flush interval.
BATCH_STEPS = 32


class VitalsCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Stream every training step's vitals to a trainvitals server.

    Per step, computed inside the compiled train step and fetched with the logs Keras already
    brings to the host: the loss of that very batch (not Keras's running mean), the gradients'
    global norm, NaN/Inf counts of the loss, the gradients and the input batch; and the step
    time and every metric Keras logs. Per-variable gradient norms every ``grad_norms_every``
    steps and on any step whose gradients are non-finite or jump tenfold. NaN/Inf in the
    weights every ``weights_every`` steps. Per second, host and GPU memory, utilisation,
    temperature, power and throttling (see ``system_metrics``). Per epoch, validation values.

    Recording is a list append per step; every few dozen steps they become points in bulk, a
    background thread sends, and an unreachable server costs one warning, never an exception
    or a slower step. The callback is ``async_safe``: a Keras backend that delivers batch ends
    on a thread pool need not wait for it.

    Args:
        server: base URL of the server, e.g. ``"http://10.0.0.5:8600"``. Default:
            ``$TRAINVITALS_SERVER``, else ``http://127.0.0.1:8600``.
        project: groups runs. Default: ``$TRAINVITALS_PROJECT``, else ``"default"``.
        run_name: shown in the dashboard; generated when not given.
        token: bearer token for the server. Default: ``$TRAINVITALS_TOKEN``.
        config: hyper-parameters to show with the run (``fit``'s epochs and steps are added).
        flush_interval: seconds between sends (default 0.2).
        grad_norms_every: steps between per-variable gradient norms (default 10).
        weights_every: steps between NaN/Inf checks of the weights (default 50, and at most
            one check a second; 0: never).
        system_metrics: seconds between host/GPU samples (default 1; 0 or False: off).
        gpu: a GPU source instead of NVML, e.g. ``trainvitals.agent.gpu.SimulatedGpu(...)``.
        watchdog: start a small watchdog process that reports a SIGKILL, an OOM kill or a
            segfault, which the training process cannot report itself (default True).
        protect: protective actions the callback takes by itself (see
            :class:`trainvitals.Protection`): stop at the first NaN/Inf and restore the last
            finite weights; save the weights when memory is about to run out. Off by default.

    The first step with a NaN/Inf also gets an autopsy (:mod:`trainvitals.agent.autopsy`): which
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
        self._weights_check: tf_vitals.WeightsCheck | None = None
        # (step, time.monotonic(), packed vitals or None, Keras's numbers): waiting to become
        # points (one clock read per step; unix times are worked out per batch of steps)
        self._pending: list[tuple[int, float, Any, dict[str, float]]] = []
        self._pending_since = 0.0
        self._pending_lock = threading.Lock()
        # (step, seconds, unix time), appended by the training thread
        self._step_times: list[tuple[int, float, float]] = []
        self._last_step = 0

    # Keras may call on_train_batch_end from a thread pool, several at once and out of order
    # (with the TensorFlow backend it calls it on the training thread): that hook only reads
    # the logs it is given and appends to a locked list; _record sorts what it takes.
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
        self._epoch_first_step = self._last_step = 0
        self._pending, self._step_times = [], []
        self.run.start()
        self.run.on_tick(self._flush_pending)  # steps of a run that hangs still arrive
        self._weights_check = _weights_check(self.model) if self._weights_every else None
        self._instrument()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_first_step = self._last_step
        self._batch_began = None  # validation time is not step time

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras calls this on the training thread, in order, right before each execution,
        # so the time between two of them is the step time as training experiences it.
        if self.guard is not None:
            self.guard.before_step()
        now = time.perf_counter()
        began = self._batch_began
        self._batch_began = (batch, now)
        if began is not None and batch > began[0]:
            # filed under the last step of the previous execution; a list append, no lock
            step = self._epoch_first_step + batch
            self._step_times.append((step, (now - began[1]) / (batch - began[0]), time.time()))

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        packed = _take_vitals(logs)
        if self.run is None:
            return
        if packed is not None:
            packed = np.asarray(packed)
        step = self._epoch_first_step + batch + 1  # global; `batch` restarts each epoch
        numbers = _numbers(logs)
        numbers.pop(LOSS, None)  # Keras's epoch running mean; "loss" is the batch's own
        now = time.monotonic()
        with self._pending_lock:
            self._last_step = max(self._last_step, step)
            pending = self._pending
            if not pending:
                self._pending_since = now
            pending.append((step, now, packed, numbers))
            if (
                len(pending) < BATCH_STEPS
                and now - self._pending_since < self._settings.flush_interval / 2
                and self.guard is None
                and (packed is None or not self._sick(*packed[:5].tolist()))
            ):
                return
            self._pending = []
        self._record(pending)

    def _sick(
        self,
        loss: float,
        nonfinite_loss: float,
        nonfinite_inputs: float,
        nonfinite_grads: float,
        norm: float,
    ) -> bool:
        """Whether a step's packed head (``tf_vitals.PACKED``) shows a NaN/Inf anywhere."""
        return bool(
            nonfinite_loss
            or nonfinite_inputs
            or nonfinite_grads
            or (self._has_loss and not math.isfinite(loss))
            or (self._has_grads and not math.isfinite(norm))
        )

    def _flush_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        if pending:
            self._record(pending)

    def _record(self, rows: list[tuple[int, float, Any, dict[str, float]]]) -> None:
        """Turn collected steps into points, series by series, and act on any NaN/Inf step."""
        run = self.run
        if run is None:
            return
        rows.sort(key=lambda row: row[0])  # Keras's worker threads may deliver out of order
        steps = [row[0] for row in rows]
        to_unix = time.time() - time.monotonic()
        times = [row[1] + to_unix for row in rows]
        columns: dict[str, ListColumns] = {}
        with self._pending_lock:  # the training thread appends without it; takers hold it
            step_times = self._step_times
            taken = step_times[: len(step_times)]
            del step_times[: len(taken)]
        if taken:
            columns[STEP_TIME] = Columns(
                [t[0] for t in taken],
                [t[2] for t in taken],
                [t[1] for t in taken],
            )
        keys = rows[0][3].keys()
        if all(row[3].keys() == keys for row in rows):
            for key in keys:
                columns[key] = Columns(steps, times, [row[3][key] for row in rows])
        else:  # a metric that comes and goes: one step at a time
            for row, unix in zip(rows, times, strict=True):
                for key, value in row[3].items():
                    column = columns.setdefault(key, Columns([], [], []))
                    column[0].append(row[0])
                    column[1].append(unix)
                    column[2].append(value)
        measured = [i for i, row in enumerate(rows) if row[2] is not None]
        unhealthy: list[int] = []
        if measured:
            unhealthy = self._vitals_columns(rows, times, measured, columns)
        run.add_columns(columns, [(row[0], row[1]) for row in rows])
        if self._weights_check is not None:
            checks = [s for s in steps if s % self._weights_every == 0]
            if checks and self._weights_check.due():
                run.log(checks[-1], {NONFINITE_WEIGHTS: self._weights_check()})
        if self.guard is not None:
            for i in measured:
                if i not in unhealthy:
                    self.guard.healthy_step(rows[i][0])
        for i in unhealthy:
            self._after_step(rows[i][0], _row_values(columns, rows[i][0]))

    def _vitals_columns(
        self,
        rows: list[tuple[int, float, Any, dict[str, float]]],
        all_times: list[float],
        measured: list[int],
        columns: dict[str, ListColumns],
    ) -> list[int]:
        """Add the packed vitals of ``rows[i]`` for i in ``measured`` to ``columns``; return
        the indexes of the steps with a NaN/Inf."""
        block = np.stack([rows[i][2] for i in measured]).astype(np.float64)
        steps = [rows[i][0] for i in measured]
        times = [all_times[i] for i in measured]
        head = block[:, : len(tf_vitals.PACKED)].T.tolist()
        loss, nonfinite_loss, nonfinite_inputs, nonfinite_grads, norm = head
        if self._has_loss:
            columns[LOSS] = Columns(steps, times, loss)
            columns[NONFINITE_LOSS] = Columns(steps, times, nonfinite_loss)
        columns[NONFINITE_INPUTS] = Columns(steps, times, nonfinite_inputs)
        unhealthy = [
            measured[j] for j, row in enumerate(zip(*head, strict=True)) if self._sick(*row)
        ]
        if not self._has_grads:
            return unhealthy
        columns[GRAD_GLOBAL_NORM] = Columns(steps, times, norm)
        columns[NONFINITE_GRADS] = Columns(steps, times, nonfinite_grads)
        names = self._grad_names
        norms = block[:, len(tf_vitals.PACKED) :]
        if norms.shape[1] != len(names):
            return unhealthy
        due = [
            j for j in range(len(steps)) if self._vitals.due(steps[j], norm[j], nonfinite_grads[j])
        ]
        if due:
            due_steps = [steps[j] for j in due]
            due_times = [times[j] for j in due]
            for name, values in zip(names, norms[due].T.tolist(), strict=True):
                columns[GRAD_NORM_PREFIX + name] = Columns(due_steps, due_times, values)
            first_bad = unhealthy[0] if unhealthy else len(rows)
            healthy_due = [j for j in due if measured[j] < first_bad]
            if healthy_due:
                last = healthy_due[-1]
                self._healthy_norms = dict(zip(names, norms[last].tolist(), strict=True))
        return unhealthy

    def _after_step(self, step: int, values: dict[str, float]) -> None:
        """The autopsy of the first NaN/Inf step, and the protective actions."""
        with self._autopsy_lock:
            if self._autopsied:
                return
            self._autopsied = True
        try:
            from trainvitals.agent import autopsy

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
        self._flush_pending()  # Keras has delivered every batch end of the epoch by now
        values = _numbers(logs)
        epoch_values = {k if k.startswith("val_") else f"epoch/{k}": v for k, v in values.items()}
        epoch_values["epoch"] = epoch + 1
        if self.run is not None:
            self.run.log(self.run.last_step, epoch_values)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        _take_vitals(logs)
        self._flush_pending()
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


def _row_values(columns: dict[str, ListColumns], step: int) -> dict[str, float]:
    """One step's values out of columns (for the rare step with a NaN/Inf)."""
    values = {}
    for name, (steps, _, column) in columns.items():
        for s, value in zip(reversed(steps), reversed(column), strict=True):
            if s == step:
                values[name] = value
                break
    return values


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


def _weights_check(model: Any) -> tf_vitals.WeightsCheck | None:
    try:
        return tf_vitals.WeightsCheck(model)
    except Exception as exc:  # an unusual model must still train
        log.warning(
            "trainvitals: no NaN/Inf check of the weights (%s: %s)", type(exc).__name__, exc
        )
        return None


def _tensorflow_env(model: Any) -> dict[str, Any]:
    try:
        return tf_vitals.describe(model)
    except Exception as exc:  # facts for the dashboard, never a reason to fail
        return {"tensorflow_describe_error": f"{type(exc).__name__}: {exc}"}
