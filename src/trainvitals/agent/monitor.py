"""``Monitor``: the same vitals as ``VitalsCallback``, for custom GradientTape loops."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainvitals.agent.config import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_READ_INTERVAL,
    DEFAULT_RING_CAPACITY,
    resolve,
)
from trainvitals.agent.exit_hooks import traceback_text
from trainvitals.agent.packing import Measured
from trainvitals.agent.run import Run
from trainvitals.agent.sampler import Source
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import EndReason, whole_micros
from trainvitals.series import NONFINITE_WEIGHTS, STEP_TIME

if TYPE_CHECKING:
    from trainvitals.agent.tf_vitals import RingWriter, WeightsCheck

#: Bytes of the latest batches held for the NaN autopsy's replay.
REPLAY_BYTES = 32 * 2**20


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
        self._vitals = StepVitals(grad_norms_every)
        self._names: tuple[str, ...] = ()
        self._weights_every = int(weights_every)
        self.run = Run(
            settings, system_metrics=system_metrics, gpu=gpu, watchdog=watchdog, notebook=notebook
        )
        self._last_log: float | None = None
        self._started = False
        self._autopsied = False
        self._healthy_norms: dict[str, float] = {}
        self._weights_check: WeightsCheck | None = None
        self._weights_checked = not (model is not None and self._weights_every)
        self._capacity = int(ring_capacity)
        self._replay_bytes = int(replay_bytes)
        self._writer: RingWriter | None = None
        self._measured: Measured | None = None
        # A writer (its trace, its ring) per layout of log()'s arguments: a loop that passes
        # gradients every few steps only switches between two, and traces each once.
        self._writers: dict[tuple[tuple[bool, ...], int], tuple[RingWriter, Measured]] = {}
        self._layout: tuple[tuple[bool, ...], int] | None = None
        self._written = 0
        # (step, unix time) of each write not read yet; the first is write number base + 1.
        self._logged: list[tuple[int, float]] = []
        self._logged_base = 0
        # Metrics logged as device values, converted when the ring's rows are handed over.
        self._deferred: list[tuple[int, float, dict[str, Any]]] = []
        # The latest batches, for the autopsy's replay (at most replay_bytes of them).
        self._batches: deque[tuple[int, Any, Any]] = deque()
        self._batch_bytes: deque[int] = deque()
        self._lock = threading.Lock()
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
        if not self._weights_checked:
            # Traced and run once here, on the training thread, as VitalsCallback does at
            # train begin: on the sender thread the trace (some 50 ms on a small CNN) and its
            # first run would land in the middle of training.
            from trainvitals.agent.tf_vitals import WeightsCheck

            self._weights_checked = True
            self._weights_check = WeightsCheck.create(self._model)
        now = time.perf_counter()
        values: dict[str, float] = {}
        if self._last_log is not None:
            values[STEP_TIME] = now - self._last_log
        self._last_log = now
        deferred: dict[str, Any] = {}
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
        with self._lock:
            if deferred:
                self._deferred.append((step, whole_micros(time.time()), deferred))
        self.run.log(step, values)
        writer = self._writer
        if writer is not None and writer.ring is not None:
            if self._written - writer.ring.read_upto >= writer.ring.capacity // 2:
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
            written = 0 if ring is None else ring.read_upto
            with self._read_lock, self._lock:
                self._writer, self._measured = cached
                self._layout = (layout, count)
                self._written = written
                self._logged, self._logged_base = [], written
        with self._lock:  # before the write: a reader may see its row at once
            self._logged.append((step, whole_micros(time.time())))
        try:
            self._writer(loss, inputs, grad_list, lr)
        except Exception:
            with self._lock:
                self._logged.pop()
            raise
        self._written += 1
        if self._model is not None and self._replay_bytes > 0 and inputs is not None:
            self._batches.append((step, inputs, targets))
            self._batch_bytes.append(_nbytes(inputs) + _nbytes(targets))
            while len(self._batches) > 1 and sum(self._batch_bytes) > self._replay_bytes:
                self._batches.popleft()
                self._batch_bytes.popleft()

    def _look(self) -> None:
        """The sender's look, every ``read_interval``: as ``VitalsCallback``'s, the rows read
        wait on the host until a frame leaves, or go at once when they are urgent (every
        step's clock reached the run when it was logged)."""
        from trainvitals.agent import packing

        with self._read_lock:
            block = self._stage()
            measured = self._measured
            head = {} if block is None or measured is None else packing.head_series(block, measured)
            if measured is None or self.run.rows_due(head):
                self._hand_over()

    def _read(self) -> None:
        """Read the ring and hand everything over now (the training thread, when half the
        ring is unread or the layout changes, and at the end)."""
        with self._read_lock:
            self._stage()
            self._hand_over()

    def _stage(self) -> Any:
        """One fetch of the ring: its new rows wait in it for the next hand-over
        (``DeviceRing.keep``); returns the values of every row waiting so (None without a
        ring)."""
        writer = self._writer
        return None if writer is None or writer.ring is None else writer.ring.keep()

    def _hand_over(self) -> None:
        """The rows kept (and the tensor metrics logged with them) become points, and the
        first NaN/Inf step gets its autopsy."""
        with self._lock:
            deferred, self._deferred = self._deferred, []
        for step, at, tensors in deferred:
            self.run.log(step, {k: float(_to_python(v)) for k, v in tensors.items()}, at)
        writer, measured = self._writer, self._measured
        if writer is None or writer.ring is None or measured is None:
            return
        numbers, block = writer.ring.take()
        if not len(numbers):
            return
        with self._lock:  # every number read was logged before it was written
            logged, base = self._logged, self._logged_base
            rows = [logged[n - 1 - base] for n in numbers.tolist()]
            del logged[: int(numbers[-1]) - base]
            self._logged_base = int(numbers[-1])
        from trainvitals.agent import packing

        steps = [row[0] for row in rows]
        times = [row[1] for row in rows]
        decoded = packing.decode(block, steps, times, measured, self._vitals)
        self.run.add_columns(decoded.columns)
        if decoded.healthy_norms is not None:
            self._healthy_norms = decoded.healthy_norms
        self._check_weights(steps)
        if decoded.sick and not self._autopsied:
            self._autopsy(steps[decoded.sick[0]], decoded.columns)

    def _check_weights(self, steps: list[int]) -> None:
        if self._weights_check is None:  # no model, weights_every=0, or a model it cannot check
            return
        checks = [s for s in steps if s % self._weights_every == 0]
        if checks and self._weights_check.due():
            self.run.log(checks[-1], {NONFINITE_WEIGHTS: self._weights_check()})

    def _autopsy(self, step: int, columns: Mapping[str, Any]) -> None:
        from trainvitals.agent import autopsy, packing

        self._autopsied = True
        held = [(inputs, targets) for s, inputs, targets in self._batches if s == step]
        inputs, targets = held[-1] if held else (None, None)
        values = packing.values_at(dict(columns), step)
        # The loop may have applied that step's NaN/Inf since: a replay still finds a layer
        # before the poisoned ones, and else leaves the verdict to the vitals.
        report = autopsy.of_step(
            self._model, values, self._healthy_norms, inputs, targets, after_update=True
        )
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


def _nbytes(structure: Any) -> int:
    """Bytes of the arrays or tensors in a (nested) batch, from their shapes: no copy."""
    total = 0
    stack = [structure]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "shape") and hasattr(item, "dtype"):
            size: Any = getattr(item.dtype, "size", None) or getattr(item.dtype, "itemsize", 4)
            count = 1
            for dim in item.shape:
                count *= int(dim or 0)
            total += count * int(size)
    return total


def _to_python(value: Any) -> Any:
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and len(value) == 1 and not isinstance(value[0], list):
        return value[0]
    return value
