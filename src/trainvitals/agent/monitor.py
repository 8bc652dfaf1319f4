"""``Monitor``: the same vitals as ``VitalsCallback``, for custom GradientTape loops.

``log`` writes the step's vitals into a device ring; what becomes of its rows is the
recorder's (:mod:`trainvitals.agent.recorder`, the callback's too), told the steps and times
of the rows by :class:`~trainvitals.agent.loop_steps.LoggedSteps`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias

from trainvitals.agent.config import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_READ_INTERVAL,
    DEFAULT_RING_CAPACITY,
    resolve,
)
from trainvitals.agent.exit_hooks import traceback_text
from trainvitals.agent.loop_steps import LoggedSteps, ReplayBatches
from trainvitals.agent.packing import Measured
from trainvitals.agent.recorder import Recorder
from trainvitals.agent.run import Run
from trainvitals.agent.sampler import Source
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import EndReason, whole_micros
from trainvitals.series import STEP_TIME

if TYPE_CHECKING:
    import tensorflow as tf

    from trainvitals.agent.ring import DeviceRing
    from trainvitals.agent.tf_vitals import RingWriter

#: Bytes of the latest batches held for the NaN autopsy's replay.
REPLAY_BYTES = 32 * 2**20
#: What ``log`` was given: (loss, inputs, gradients, learning rate) or not, and how many
#: gradients (-1: none); each layout has a ring writer of its own.
Layout: TypeAlias = tuple[tuple[bool, bool, bool, bool], int]


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
        ring_capacity: rows of the device ring the vitals wait in (see
            :mod:`trainvitals.agent.ring`); the training thread reads it itself every
            ``ring_capacity // 2`` steps when the sender thread has not.
        replay_bytes: the latest batches kept for the autopsy's replay, in bytes (default
            32 MiB). The first NaN/Inf step is seen a fraction of a second after it ran; its
            batch is replayed layer by layer if it is still held and the weights are still
            finite (a loop that stops at the NaN, or whose optimizer skips such a step), else
            the autopsy works from the vitals. 0: never hold a batch.
        notebook: as for :class:`VitalsCallback`.

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
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        read_interval: float = DEFAULT_READ_INTERVAL,
        grad_norms_every: int = 10,
        weights_every: int = 50,
        system_metrics: float | bool = 1.0,
        gpu: Source | None = None,
        watchdog: bool = True,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        replay_bytes: int = REPLAY_BYTES,
        notebook: bool | None = None,
    ) -> None:
        settings = resolve(
            server, project, run_name, token, config, flush_interval, read_interval=read_interval
        )
        self._model = model
        self._optimizer = optimizer
        self._capacity = int(ring_capacity)
        self.run = Run(
            settings, system_metrics=system_metrics, gpu=gpu, watchdog=watchdog, notebook=notebook
        )
        self._started = False
        self._last_log: float | None = None
        self._names: tuple[str, ...] = ()  # the variables' paths, for the per-variable norms
        # The weights' check is made at the first log (see there), when there is a model.
        self._weights_due = model is not None and int(weights_every) > 0
        self._batches = ReplayBatches(int(replay_bytes) if model is not None else 0)
        self._steps = LoggedSteps()
        self._recorder = Recorder(
            self.run,
            model,
            StepVitals(grad_norms_every),
            self._steps,
            self._batches.evidence,
            weights_every=int(weights_every),
        )
        # A writer (its trace, its ring) per layout of log()'s arguments: a loop that passes
        # gradients every few steps only switches between two, and traces each once.
        self._writers: dict[Layout, tuple[RingWriter, Measured]] = {}
        self._layout: Layout | None = None
        self._writer: RingWriter | None = None
        self._measured: Measured | None = None
        # Metrics logged as device values: (step, unix time, {name: value}), converted when
        # the ring's rows are handed over.
        self._deferred: list[tuple[int, float, dict[str, tf.Tensor]]] = []
        self._deferred_lock = threading.Lock()
        # Held by whoever reads the ring or hands rows over, and while the layout changes.
        self._read_lock = threading.Lock()

    def start(self) -> Monitor:
        if not self._started:
            self.run.start()
            self.run.on_tick(self._look)
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
            self.finish(EndReason.EXCEPTION, traceback_text(exc))

    def finish(self, reason: str = EndReason.COMPLETED, traceback_text: str | None = None) -> bool:
        """End the run; returns whether the server acknowledged everything (False, doing
        nothing, in a child forked from the training process: the run is not its to end)."""
        if not self.run.here:
            return False
        if self._started:
            self._read()
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
        ``targets`` (the batch's labels) only serve the NaN autopsy.

        Nothing is fetched from the device here: the vitals are written into a ring on the
        device and read a few times a second (and every ``ring_capacity // 2`` steps) by one
        fetch; metrics given as tensors are converted then too."""
        self.start()
        if self._weights_due:
            # Traced and run once here, on the training thread, as VitalsCallback does at
            # train begin: on the sender thread the trace (some 50 ms on a small CNN) and its
            # first run would land in the middle of training.
            from trainvitals.agent.tf_vitals import WeightsCheck

            self._weights_due = False
            self._recorder.weights = WeightsCheck.create(self._model)
        now = time.perf_counter()
        values: dict[str, float] = {}
        if self._last_log is not None:
            values[STEP_TIME] = now - self._last_log
        self._last_log = now
        deferred: dict[str, tf.Tensor] = {}
        for name, value in (metrics or {}).items():
            if hasattr(value, "numpy"):
                from trainvitals.agent import tf_vitals

                # A device value, read with the ring, not now; a variable as it is now (a
                # snapshot on the device), not as it will be then.
                deferred[name] = tf_vitals.snapshot(value)
            else:
                values[name] = float(_to_python(value))
        if loss is not None or grads is not None or inputs is not None:
            self._write(step, loss, grads, inputs, targets)
        if deferred:
            with self._deferred_lock:
                self._deferred.append((step, whole_micros(time.time()), deferred))
        self.run.log(step, values)
        writer = self._writer
        if writer is not None and writer.ring is not None:
            if self._steps.written - writer.ring.read_upto >= writer.ring.capacity // 2:
                self._read()

    def _write(self, step: int, loss: Any, grads: Any, inputs: Any, targets: Any) -> None:
        from trainvitals.agent import packing, tf_vitals

        grad_list = None if grads is None else list(grads)
        lr = None if self._optimizer is None else tf_vitals.learning_rate_of(self._optimizer)
        layout = (loss is not None, inputs is not None, grad_list is not None, lr is not None)
        count = -1 if grad_list is None else len(grad_list)
        if self._writer is None or self._layout != (layout, count):
            self._read()  # what the last layout wrote, before rows of this one
            cached = self._writers.get((layout, count))
            if cached is None:
                measured = packing.Measured(
                    loss=layout[0],
                    inputs=layout[1],
                    grads=layout[2],
                    names=self._variable_names(max(count, 0)),
                    lr=layout[3],
                )
                cached = self._writers[(layout, count)] = (
                    tf_vitals.RingWriter(self._capacity),
                    measured,
                )
            ring = cached[0].ring  # every row of it was read when the loop left this layout
            with self._read_lock:
                self._writer, self._measured = cached
                self._layout = (layout, count)
                self._steps.restart(0 if ring is None else ring.read_upto)
        self._steps.note(step, time.time())
        try:
            self._writer(loss, inputs, grad_list, lr)
        except Exception:
            self._steps.unnote()
            raise
        self._batches.keep(step, inputs, targets)

    def _look(self) -> None:
        """The sender's look, every ``read_interval`` (:meth:`Recorder.look`); the tensor
        metrics logged since the last hand-over go with the rows."""
        with self._read_lock:
            ring, measured = self._ring()
            if ring is None or measured is None or self._recorder.look(ring, measured):
                self._log_deferred()

    def _read(self) -> None:
        """Read the ring and hand everything over now (the training thread, when half the
        ring is unread or the layout changes, and at the end)."""
        with self._read_lock:
            ring, measured = self._ring()
            if ring is not None and measured is not None:
                self._recorder.stage(ring)
                self._recorder.hand_over(ring, measured)
            self._log_deferred()

    def _ring(self) -> tuple[DeviceRing | None, Measured | None]:
        writer = self._writer
        return (writer.ring if writer is not None else None), self._measured

    def _log_deferred(self) -> None:
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, []
        for step, at, tensors in deferred:
            self.run.log(step, {k: float(_to_python(v)) for k, v in tensors.items()}, at)

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
