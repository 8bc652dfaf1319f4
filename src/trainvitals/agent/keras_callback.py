"""``VitalsCallback``: stream a ``model.fit`` run to a trainvitals server.

The callback holds the Keras hooks, which record and hand over: the train step is tapped by
``tap.py``, collected steps become columns in ``packing.py``, and a NaN/Inf step's autopsy and
the protective actions are ``autopsy.py``'s and ``protect.py``'s.

This module imports Keras; ``trainvitals/__init__.py`` loads it only when
``trainvitals.VitalsCallback`` is first used, so ``import trainvitals`` stays light.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import numpy.typing as npt

from trainvitals.agent import autopsy, packing, tf_vitals
from trainvitals.agent.bad_step import BadStep
from trainvitals.agent.config import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_READ_INTERVAL,
    DEFAULT_RING_CAPACITY,
    generate_run_name,
    resolve,
)
from trainvitals.agent.exit_hooks import signals_caught, take_signal_since, traceback_text
from trainvitals.agent.fitcall import FitCall
from trainvitals.agent.packing import Row, StepTime
from trainvitals.agent.protect import Guard, Protection
from trainvitals.agent.run import Run
from trainvitals.agent.sampler import Source
from trainvitals.agent.tap import TrainStepTap
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import EndReason
from trainvitals.series import (
    EPOCH,
    EPOCH_PREFIX,
    LOSS,
    NONFINITE_WEIGHTS,
    STEP_TIME,
    VAL_PREFIX,
)

if TYPE_CHECKING:
    from trainvitals.agent.ring import DeviceRing

log = logging.getLogger("trainvitals")

#: Without a device ring (a strategy with several replicas, a step the tap could not wrap):
#: steps collected from the logs before they become points all at once. A step with a
#: NaN/Inf is handled at once, and no step waits longer than half the read interval.
BATCH_STEPS = 32


class VitalsCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Stream every training step's vitals to a trainvitals server.

    Per step, computed inside the compiled train step: the loss of that very batch (not
    Keras's running mean), the gradients' global norm, NaN/Inf counts of the loss, the
    gradients and the input batch, the learning rate, and every metric Keras computes; and the
    step time. Per-variable gradient norms every ``grad_norms_every`` steps and on any step
    whose gradients are non-finite or jump tenfold. NaN/Inf in the weights every
    ``weights_every`` steps. Per second, host and GPU memory, utilisation, temperature, power
    and throttling (see ``system_metrics``). Per epoch, validation values.

    The train step writes its vitals into a ring on the device (:mod:`trainvitals.agent.ring`)
    and nothing is fetched per step: a background thread reads the ring every
    ``read_interval`` with one fetch (and the training thread every ``ring_capacity // 2``
    steps if that thread has not), so every step is recorded, under ``steps_per_execution``
    too. The points are sent every ``flush_interval``, and at once when urgent
    (:mod:`trainvitals.agent.urgency`): a NaN/Inf is reported with its exact step within about
    ``read_interval``, and so are a steep rise of the gradient norm and memory racing to its
    limit. Per step, the hooks note the time and the step number; a background thread sends,
    and an unreachable server costs one warning, never an exception or a slower step. The
    callback is ``async_safe``: a Keras backend that delivers batch ends on a thread pool need
    not wait for it.

    Args:
        server: base URL of the server, e.g. ``"http://10.0.0.5:8600"``. Default:
            ``$TRAINVITALS_SERVER``, else ``http://127.0.0.1:8600``.
        project: groups runs. Default: ``$TRAINVITALS_PROJECT``, else ``"default"``.
        run_name: shown in the dashboard; generated when not given.
        token: bearer token for the server. Default: ``$TRAINVITALS_TOKEN``.
        config: hyper-parameters to show with the run (``fit``'s epochs and steps are added).
        flush_interval: the most seconds a point waits before it is sent (default 1); a
            NaN/Inf, a steep rise of the gradient norm or memory racing to its limit goes at
            the next read.
        read_interval: seconds between reads of the device ring (default 0.2; at most
            ``flush_interval``).
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
            With it, the weights are copied to the host every ``good_every`` steps.
        ring_capacity: rows of the device ring (default 1024).
        notebook: in a notebook, show each run inline, its link and its page (default: yes,
            unless ``TRAINVITALS_NOTEBOOK=0``). Elsewhere each run's start prints its link.

    The first step with a NaN/Inf also gets an autopsy (:mod:`trainvitals.agent.autopsy`): its
    batch and the weights of before its update are kept on that step only, and replayed to
    name the first cause (the data, a layer, the loss, the backward pass, poisoned weights, a
    learning-rate blow-up). It joins the server's ``nonfinite`` alert, with that cause's
    remedy.

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
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        read_interval: float = DEFAULT_READ_INTERVAL,
        grad_norms_every: int = 10,
        weights_every: int = 50,
        system_metrics: float | bool = 1.0,
        gpu: Source | None = None,
        watchdog: bool = True,
        protect: Protection | None = None,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        notebook: bool | None = None,
    ) -> None:
        # What a copy is made from (__deepcopy__): the arguments as given, not this callback's
        # state. Taken first, while the locals are the parameters, and so every one of them.
        given = dict(locals())
        self._arguments: dict[str, Any] = {
            name: value for name, value in given.items() if name not in ("self", "__class__")
        }
        if config is not None:
            self._arguments["config"] = dict(config)  # as resolve() takes it
        super().__init__()
        self._protect = protect
        self._ring_capacity = int(ring_capacity)
        self.guard: Guard | None = None
        self._autopsied = False
        self._poisoned_at_start = False
        self._fits = 1  # the fits this callback has made runs of, for numbering their names
        self._healthy_norms: dict[str, float] = {}
        self._autopsy_lock = threading.Lock()
        self._settings = resolve(
            server, project, run_name, token, config, flush_interval, read_interval=read_interval
        )
        self._vitals = StepVitals(grad_norms_every)
        self._weights_every = int(weights_every)
        self._system_metrics = system_metrics
        self._gpu = gpu
        self._watchdog = watchdog
        self._notebook = notebook
        self.run: Run | None = None
        self._tap: TrainStepTap | None = None
        self._epoch_first_step = 0
        self._batch_began: tuple[int, float] | None = None
        self._weights_check: tf_vitals.WeightsCheck | None = None
        # Steps waiting to become points (one clock read per step; unix times are worked out
        # per batch of steps), and the step times, appended by the training thread.
        self._pending: list[Row] = []
        self._pending_since = 0.0
        self._pending_lock = threading.Lock()
        self._step_times: list[StepTime] = []
        self._last_step = 0
        # With the device ring: (step, time.monotonic()) at each execution's end, appended by
        # the training thread, and the last one a read has used.
        self._ends: list[tuple[int, float]] = []
        self._last_end: tuple[int, float] = (0, time.monotonic())
        # The execution ends noted by the looks since the last hand-over (the rows they read
        # wait in the ring: DeviceRing.keep).
        self._staged_clock: list[tuple[int, float]] = []
        self._staged_step_times: list[StepTime] = []
        # The steps of an epoch, as Keras knows them when fit begins (0: it does not).
        self._epoch_steps = 0
        # Held by whoever reads the ring or hands steps over, and while a fit's state is
        # replaced (re-entrant: the looks and the ending of a left fit flush under it).
        self._read_lock = threading.RLock()
        # The fit call under way (None: a loop of the script's own calls the hooks), and
        # whether a look has seen it left.
        self._fit: FitCall | None = None
        self._fit_gone = False
        self._looking: Run | None = None  # the run whose looks read the ring now
        self._signal_mark = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> VitalsCallback:
        """A new callback made from the same arguments, with none of this one's state.

        KerasTuner deep-copies the search's callbacks for each trial: each copy then streams
        its trial's fits as runs of their own. The locks, threads and open run of this
        callback are not copied; the GPU source given as ``gpu`` is shared (it reads a
        device), and a ``config`` that cannot be deep-copied is copied as a new dict whose
        values are shared (it is only read). A subclass's own attributes are deep-copied; its
        ``__init__`` is not called again, and an attribute of this class that it set after
        ``super().__init__()`` is as the arguments make it.
        """
        return self._made_again(memo, deep=True)

    def __copy__(self) -> VitalsCallback:
        """As :meth:`__deepcopy__`, the arguments and a subclass's attributes shared: a
        copy sharing this callback's run and locks would record into the same run."""
        return self._made_again({}, deep=False)

    def _made_again(self, memo: dict[int, Any], deep: bool) -> VitalsCallback:
        def copied(value: Any) -> Any:
            return copy.deepcopy(value, memo) if deep else value

        cls = type(self)
        made = cls.__new__(cls)
        memo[id(self)] = made
        arguments = dict(self._arguments)
        config = arguments["config"]
        if deep and config is not None:
            try:
                # With a memo of its own: a deep copy that fails halfway leaves its half-made
                # parts in its memo, which must not be the caller's.
                config = copy.deepcopy(config)
            except Exception:  # a value that cannot be copied: the config is only read
                config = dict(config)
        arguments["config"] = config
        arguments["protect"] = copied(arguments["protect"])  # the rest are plain values
        VitalsCallback.__init__(made, **arguments)
        for name, value in vars(self).items():
            if name not in vars(made):
                setattr(made, name, copied(value))
        return made

    # Keras may call on_train_batch_end from a thread pool, several at once and out of order
    # (with the TensorFlow backend it calls it on the training thread): that hook only reads
    # the logs it is given and appends to a locked list; _record sorts what it takes.
    async_safe = True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        with self._read_lock:  # this callback's previous fit, left by an exception just now
            self._end_left_fit()
            self._looking, self._tap = None, None  # no look reads while this fit is set up
        fit = FitCall.find(self.model)
        params = {k: v for k, v in (self.params or {}).items() if k in ("epochs", "steps")}
        self._epoch_steps = int(params.get("steps") or 0)  # 0: Keras does not know
        self.guard = Guard(self._protect, self.model) if self._protect is not None else None
        self._autopsied = False
        settings = replace(self._settings, config={**params, **self._settings.config})
        if self.run is not None and self._arguments["run_name"] is None:
            # A name generated for each fit: a callback used again (a second fit, a fine-tune)
            # would give every run it makes the same one.
            settings = replace(settings, run_name=generate_run_name())
        elif self.run is not None:
            # A name given once, used again: numbered, so the runs list tells the fits apart.
            self._fits += 1
            settings = replace(settings, run_name=f"{settings.run_name}-{self._fits}")
        self.run = Run(
            settings,
            system_metrics=self._system_metrics,
            gpu=self._gpu,
            env=tf_vitals.describe(self.model, fit.argument("x") if fit is not None else None),
            watchdog=self._watchdog,
            on_system=self.guard.on_system if self.guard is not None else None,
            notebook=self._notebook,
        )
        self._epoch_first_step = self._last_step = 0
        self._pending, self._step_times, self._ends = [], [], []
        self._staged_clock, self._staged_step_times = [], []
        self._last_end = (0, time.monotonic())
        self._signal_mark = signals_caught()
        with self._read_lock:  # the looks begin: they ask after the fit, and read no ring yet
            self._fit, self._fit_gone, self._looking = fit, False, self.run
        self.run.start()
        self.run.on_tick(functools.partial(self._look_for, self.run))  # a hung run's steps too
        self._weights_check = (
            tf_vitals.WeightsCheck.create(self.model) if self._weights_every else None
        )
        # Room for two executions at least: the hook reads between executions only.
        per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        # Whether the weights were already NaN/Inf as fit began (a restored checkpoint, an
        # earlier fit): the autopsy tells that from weights an update poisoned.
        self._poisoned_at_start = bool(self._weights_check and self._weights_check.first > 0)
        tap = TrainStepTap(
            self.model,
            max(self._ring_capacity, 2 * per_execution),
            flag_nonfinite=self.guard is not None,
            fit=fit,
            bad_step=BadStep() if BadStep.possible(self.model) else None,
        )
        tap.install()
        with self._read_lock:  # the looks read its ring from now on
            self._tap = tap

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
        flagged = TrainStepTap.take_flag(logs)
        packed = TrainStepTap.take(logs)
        tap = self._tap
        if self.run is None or tap is None:
            return
        # Keras numbers an execution by its last step as if it were whole: the last of an
        # epoch that steps_per_execution does not divide ends past the epoch's last batch.
        if self._epoch_steps:
            batch = min(batch, self._epoch_steps - 1)
        step = self._epoch_first_step + batch + 1  # global; `batch` restarts each epoch
        now = time.monotonic()
        ring = tap.ring
        if ring is not None:
            # The step's vitals and metrics are in the device ring: note when it ended, and
            # read the ring here only when half of it is unread (a hook's whole work).
            self._last_step = step
            self._ends.append((step, now))
            if self.guard is not None:
                self.guard.after_step(step)
            if flagged or step - ring.read_upto >= ring.capacity // 2:
                self._flush_pending()  # a NaN/Inf step, with protect=, is acted on at once
            return
        # No ring (a model or strategy the tap could not give one): the vector, if any, and
        # Keras's numbers come with the logs of the last step of each execution.
        if packed is not None:
            packed = np.asarray(packed)
        numbers = _numbers(logs)
        numbers.pop(LOSS, None)  # Keras's epoch running mean; "loss" is the batch's own
        if self.guard is not None:
            self.guard.after_step(step)
        with self._pending_lock:
            self._last_step = max(self._last_step, step)
            pending = self._pending
            if not pending:
                self._pending_since = now
            pending.append((step, now, packed, numbers))
            if (
                len(pending) < BATCH_STEPS
                and now - self._pending_since < self._settings.read_interval / 2
                and self.guard is None
                and (packed is None or not packing.sick(packed, tap.measured))
            ):
                return
            self._pending = []
        step_times = self._take_step_times()
        rows = packing.pivot(pending, step_times, tap.measured, self._vitals, _to_unix())
        with self._read_lock:
            self._record(rows)

    def _look_for(self, run: Run) -> None:
        """``run``'s look, while its fit is under way: none once it has ended (its last
        frames are on their way), nor for the run of an earlier fit of this callback."""
        # Not waiting for the lock: the training thread may hold it, or a SIGTERM handler
        # that waits for this thread to send the end (a look skipped now comes again soon).
        if not self._read_lock.acquire(blocking=False):
            return
        try:
            if run is self._looking:
                self._look(run)
        finally:
            self._read_lock.release()

    def _look(self, run: Run) -> None:
        """The sender's look, every ``read_interval``: read the ring, and hand what it has read
        to the run only when a frame leaves at this look anyway, or when the rows held since
        the last hand-over hold something urgent (:mod:`~trainvitals.agent.urgency`).
        Otherwise the rows wait for the next send: turning them into points costs the sender
        about 0.4 ms a look inside a fit whatever their number, so one hand-over a frame pays
        it once, not at each of five looks. The hang detector still learns of every step at
        each look. A fit that an exception left ends its run (:meth:`_left_fit`). Called with
        the read lock held."""
        if self._left_fit():
            return
        tap = self._tap
        if tap is None or tap.ring is None:
            self._flush_pending()
            return
        block = self._stage(tap.ring, run)
        # With protect=, every look confirms healthy steps, so that the weights' copies
        # taken before them can go (one every `good_every` steps would pile up for a second).
        if self.guard is not None or run.rows_due(packing.head_series(block, tap.measured)):
            self._record(self._hand_over(tap.ring, tap.measured))

    def _left_fit(self) -> bool:
        """Whether ``fit`` has been left without ``on_train_end`` (an exception: Keras then
        skips the hook), asked at every look before the ring is read (a walk of the training
        thread's stack: microseconds, five times a second). Once it has, the ring is no longer
        read at the looks: a later fit without the callback still runs the tapped step, and its
        rows are not this run's. At the first look that finds it gone,
        the steps whose ends the hooks saw are kept; at the next, the run ends
        (:meth:`_end_left_fit`): an uncaught exception's own report (the excepthook, then the
        exit) has had the first word, with its traceback. Called with the read lock held."""
        fit = self._fit
        if fit is None or fit.running():
            return False
        if self._fit_gone:
            self._end_left_fit()
        else:
            self._fit_gone = True
            self.guard = None  # nothing to stop or restore: that fit is over
            self._flush_pending(upto=self._last_step)
        return True

    def _end_left_fit(self) -> None:
        """End the run of a fit that an exception left (on the sender's thread, or on the
        training thread at this callback's next fit): its steps so far, then ``signal:SIGINT``
        if Ctrl-C (a notebook's interrupt) came during it, else ``exception``, with the
        traceback where it can still be seen (a notebook shows it). Without this the process,
        which lives on, kept the run ``running``. The model keeps the tap until the next fit
        (or ``train_on_batch``) takes it off (``TrainStepTap``). Called with the read lock held."""
        fit, run = self._fit, self.run
        if fit is None or run is None:
            return
        self._fit, self.guard = None, None  # nothing to stop or restore: that fit is over
        error = None
        try:
            error = fit.exception()
            self._flush_pending(upto=self._last_step)
        except Exception:  # the run ends all the same
            log.exception("trainvitals: the last steps of a fit left by an exception are lost")
        finally:
            self._looking = None  # the ring is a later fit's from now on
            fit.forget()
            # A notebook's kernel may put its own SIGINT handler back around each cell, past
            # the agent's: a KeyboardInterrupt says Ctrl-C as well.
            reason = take_signal_since(self._signal_mark) or (
                EndReason.SIGINT if isinstance(error, KeyboardInterrupt) else EndReason.EXCEPTION
            )
            text = traceback_text(error) if error is not None else None
            log.warning("trainvitals: fit() was left by an exception; run %r ends as %s",
                        run.config.run_name, reason)  # fmt: skip
            run.finish(reason, text, timeout=0)  # the sender sends it: no wait here

    def _flush_pending(self, upto: int | None = None) -> None:
        """Hand over every step recorded so far (the training thread calls this when half
        the ring is unread, at a NaN/Inf step with ``protect=``, and at each epoch's end;
        without a ring, the sender at each look); from the ring, none after step ``upto``."""
        tap = self._tap
        if tap is None:
            return
        with self._read_lock:  # blocks go to the run in step order, whoever reads
            if tap.ring is not None:
                if self.run is not None:
                    self._stage(tap.ring, self.run, upto)
                self._record(self._hand_over(tap.ring, tap.measured))
                return
            with self._pending_lock:
                pending, self._pending = self._pending, []
            if pending:
                self._record(
                    packing.pivot(
                        pending, self._take_step_times(), tap.measured, self._vitals, _to_unix()
                    )
                )

    def _take_step_times(self) -> list[StepTime]:
        with self._pending_lock:  # the training thread appends without it; takers hold it
            step_times = self._step_times
            taken = step_times[: len(step_times)]
            del step_times[: len(taken)]
        return taken

    def _stage(
        self, ring: DeviceRing, run: Run, upto: int | None = None
    ) -> npt.NDArray[np.float64]:
        """One fetch of the ring: its fresh rows are kept for the next hand-over, and every
        row kept since the last one is returned (a rise held for three steps may begin in an
        earlier look's rows); the execution ends noted since the last look go to the run's
        hang detector now."""
        # The execution ends and step times are taken before the read: each is then of an
        # execution whose rows the read sees, so none lies past the rows but where Keras
        # numbered an execution past the data (the last of an epoch that steps_per_execution
        # does not divide, numbered as a whole one; with data of unknown length, the one more
        # that began and found no batch): those are filed under the last step there was.
        ends = self._ends
        clock = ends[: len(ends)]
        del ends[: len(clock)]
        step_times = self._take_step_times()
        lost = ring.lost
        block = ring.keep(upto)
        if ring.lost > lost:
            log.warning("trainvitals: %d steps' vitals overwritten before a read", ring.lost - lost)
        top = ring.read_upto
        if clock and clock[-1][0] > top:  # in step order: only the last few can lie past
            clock = [(min(step, top), at) for step, at in clock]
        if step_times and step_times[-1][0] > top:
            step_times = [(min(step, top), took, at) for step, took, at in step_times]
        self._staged_step_times.extend(step_times)
        if clock:
            self._staged_clock.extend(clock)
            run.add_columns({}, clock)
        return block

    def _hand_over(self, ring: DeviceRing, measured: packing.Measured) -> packing.Pivot:
        """The rows the looks kept, as columns: each step's time is when its execution ended
        (interpolated between executions of several steps; a step whose end no hook has noted
        yet is timed now). The step ends went to the run at their looks."""
        numbers, block = ring.take()
        clock, self._staged_clock = self._staged_clock, []
        now = time.monotonic()
        steps = numbers.tolist()
        times: list[float] = []
        if steps:
            known = [self._last_end, *clock]
            if steps[-1] > known[-1][0]:
                known.append((steps[-1], now))
            at = np.interp(numbers, [k[0] for k in known], [k[1] for k in known])
            times = packing.micros(at + _to_unix())
        if clock:
            self._last_end = clock[-1]
        decoded = packing.decode(block, steps, times, measured, self._vitals)
        columns = decoded.columns
        step_times, self._staged_step_times = self._staged_step_times, []
        if step_times:
            columns[STEP_TIME] = packing.step_time_columns(step_times)
        sick = [steps[j] for j in decoded.sick]
        healthy = np.delete(numbers, decoded.sick).tolist()
        return packing.Pivot(columns, [], steps, healthy, sick, decoded.healthy_norms)

    def _record(self, batch: packing.Pivot) -> None:
        """Hand collected steps to the run, and act on any NaN/Inf step."""
        run = self.run
        if run is None:
            return
        if batch.healthy_norms is not None:
            self._healthy_norms = batch.healthy_norms
        run.add_columns(batch.columns, batch.clock)
        if self._weights_check is not None:
            checks = [s for s in batch.steps if s % self._weights_every == 0]
            if checks and self._weights_check.due():
                count = self._weights_check()
                # Filed under the step the weights were read at (training goes on while the
                # sender reads them: the ring's count of rows, read after them), not the
                # earlier one that made the check due: a NaN that came in between would seem
                # to come before the step that made it.
                ring = self._tap.ring if self._tap is not None else None
                at = max(checks[-1], ring.written() if ring is not None else 0)
                run.log(at, {NONFINITE_WEIGHTS: count})
        for step in batch.sick:
            self._after_step(step, packing.values_at(batch.columns, step))
        if self.guard is not None and batch.healthy:
            first_sick = batch.sick[0] if batch.sick else None
            healthy = [s for s in batch.healthy if first_sick is None or s < first_sick]
            if healthy:
                self.guard.healthy_upto(healthy[-1])

    def _after_step(self, step: int, values: dict[str, float]) -> None:
        """The autopsy of the first NaN/Inf step, and the protective actions."""
        with self._autopsy_lock:
            if self._autopsied:
                return
            self._autopsied = True
        bad_step = self._tap.bad_step if self._tap is not None else None
        report = autopsy.of_step(
            self.model,
            values,
            self._healthy_norms,
            kept=bad_step.take() if bad_step is not None else None,
            poisoned_at_start=self._poisoned_at_start,
        )
        if self.guard is not None:
            action = self.guard.nonfinite_step(step)
            if action is not None:
                report["action"] = action
        log.warning("trainvitals: NaN/Inf at step %d: %s", step, report.get("verdict", report))
        if self.run is not None:
            self.run.report_autopsy(step, report)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        TrainStepTap.take(logs)
        self._flush_pending()  # Keras has delivered every batch end of the epoch by now
        ring = self._tap.ring if self._tap is not None else None
        if ring is not None:
            # Every row of the epoch is read now: the count the next epoch's steps follow,
            # where Keras did not know the epoch's length to number its last execution.
            self._last_step = min(self._last_step, ring.read_upto)
        values = _numbers(logs)
        epoch_values = {
            k if k.startswith(VAL_PREFIX) else EPOCH_PREFIX + k: v for k, v in values.items()
        }
        epoch_values[EPOCH] = epoch + 1
        if self.run is not None:
            self.run.log(self.run.last_step, epoch_values)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        with self._read_lock:
            fit, self._fit = self._fit, None  # fit returns: the looks no longer ask
        if fit is not None:
            fit.forget()
        TrainStepTap.take(logs)
        self._flush_pending()
        self._looking = None
        if self._tap is not None:
            self._tap.remove()
        if self.guard is not None:
            self.guard.at_end()
        if self.run is not None:
            self.run.finish(EndReason.COMPLETED)


def _to_unix() -> float:
    """What turns a ``time.monotonic()`` into a unix time, now."""
    return time.time() - time.monotonic()


def _numbers(logs: dict[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue  # strings or arrays some callbacks put in logs
    return out
