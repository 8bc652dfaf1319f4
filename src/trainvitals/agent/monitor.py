"""``Monitor``: the same vitals as ``VitalsCallback``, for custom GradientTape loops."""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainvitals.agent.config import resolve
from trainvitals.agent.run import Run
from trainvitals.agent.sampler import Source
from trainvitals.agent.vitals import StepVitals, healthy
from trainvitals.protocol import EndReason
from trainvitals.series import NONFINITE_WEIGHTS, STEP_TIME

if TYPE_CHECKING:
    from trainvitals.agent.tf_vitals import WeightsCheck


class Monitor:
    """Stream a custom training loop's vitals to a trainvitals server.

    ``log`` takes the step's tensors and computes from them what the Keras callback computes
    in the train step: the loss, the gradients' global and per-variable norms, NaN/Inf counts
    of the loss, gradients and inputs, and the time between calls. It fetches everything from
    the device in one go. Used as a context manager, the run ends ``completed`` or
    ``exception`` (with the traceback) with the block.

    Args:
        server, project, run_name, token, config: as for :class:`VitalsCallback`.
        model: names the per-variable norms (``grad/norm/<variable path>``), enables the
            weights' NaN/Inf check every ``weights_every`` steps, and lets the first step with
            a NaN/Inf be replayed layer by layer on its batch
            (:func:`trainvitals.agent.autopsy.replay`).
            Call ``log`` before ``apply_gradients`` for the replay to see the weights that step
            used.
        optimizer: records its learning rate as the series ``lr`` at each ``log``, fetched
            with the step's other vitals (a ``LearningRateSchedule`` is evaluated at the
            optimizer's iteration: after ``apply_gradients``, the rate of the next update).
        grad_norms_every: steps between per-variable gradient norms (default 10); they are
            also recorded on any step with non-finite gradients.
        system_metrics, gpu, watchdog: as for :class:`VitalsCallback`.

    Example:
        ```python
        with trainvitals.Monitor(project="gan", run_name="try-7", model=model,
                                 optimizer=optimizer) as mon:
            for step, (x, y) in enumerate(dataset):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                mon.log(step, loss=loss, grads=grads, inputs=x, metrics={"acc": acc})
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
        model: Any = None,
        optimizer: Any = None,
        flush_interval: float = 0.2,
        grad_norms_every: int = 10,
        weights_every: int = 50,
        system_metrics: float | bool = 1.0,
        gpu: Source | None = None,
        watchdog: bool = True,
    ) -> None:
        settings = resolve(server, project, run_name, token, config, flush_interval)
        self._model = model
        self._optimizer = optimizer
        self._vitals = StepVitals(grad_norms_every)
        self._names: tuple[str, ...] = ()
        self._weights_every = int(weights_every)
        self.run = Run(settings, system_metrics=system_metrics, gpu=gpu, watchdog=watchdog)
        self._last_log: float | None = None
        self._started = False
        self._autopsied = False
        self._healthy_norms: dict[str, float] = {}
        self._weights_check: WeightsCheck | None = None

    def start(self) -> Monitor:
        if not self._started:
            self.run.start()
            self._started = True
        return self

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.finish()
        else:
            self.finish(EndReason.EXCEPTION, "".join(traceback.format_exception(kind, exc, tb)))

    def finish(self, reason: str = EndReason.COMPLETED, traceback_text: str | None = None) -> bool:
        """End the run; returns whether the server acknowledged everything."""
        return self.run.finish(reason, traceback_text)

    def log(
        self,
        step: int,
        loss: Any = None,
        grads: Sequence[Any] | None = None,
        inputs: Any = None,
        metrics: Mapping[str, Any] | None = None,
        targets: Any = None,
    ) -> None:
        """Record step ``step``. Every argument is optional; tensors, arrays or numbers.
        ``targets`` (the batch's labels) only serve the NaN autopsy."""
        self.start()
        now = time.perf_counter()
        values: dict[str, float] = {}
        if self._last_log is not None:
            values[STEP_TIME] = now - self._last_log
        self._last_log = now
        norms: dict[str, float] | None = None
        if loss is not None or grads is not None or inputs is not None:
            from trainvitals.agent import packing, tf_vitals

            grad_list = None if grads is None else list(grads)
            lr = None if self._optimizer is None else tf_vitals.learning_rate_of(self._optimizer)
            vector = tf_vitals.step_vitals_now(loss, inputs, grad_list, lr).numpy()
            measured = packing.Measured(
                loss=loss is not None,
                inputs=inputs is not None,
                grads=grad_list is not None,
                names=self._variable_names(len(vector) - len(packing.HEAD)),
                lr=lr is not None,
            )
            step_values, norms = packing.decode_one(vector, step, measured, self._vitals)
            values.update(step_values)
            if self._model is not None and self._weights_every and step % self._weights_every == 0:
                if self._weights_check is None:
                    self._weights_check = tf_vitals.WeightsCheck(self._model)
                if self._weights_check.due():
                    values[NONFINITE_WEIGHTS] = self._weights_check()
        for name, value in (metrics or {}).items():
            values[name] = float(_to_python(value))
        self.run.log(step, values)
        if healthy(values):
            self._healthy_norms = norms or self._healthy_norms
        elif not self._autopsied:
            self._autopsied = True
            from trainvitals.agent import autopsy

            report = autopsy.of_step(self._model, values, self._healthy_norms, inputs, targets)
            self.run.report_autopsy(step, report)

    def _variable_names(self, count: int) -> tuple[str, ...]:
        if len(self._names) != count:
            from trainvitals.agent import tf_vitals

            variables = list(getattr(self._model, "trainable_variables", None) or [])
            self._names = (
                tuple(tf_vitals.variable_name(v, i) for i, v in enumerate(variables))
                if len(variables) == count
                else tuple(str(i) for i in range(count))
            )
        return self._names


def _to_python(value: Any) -> Any:
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and len(value) == 1 and not isinstance(value[0], list):
        return value[0]
    return value
