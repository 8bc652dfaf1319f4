"""``VitalsCallback``: stream a ``model.fit`` run to a trainvitals server.

The callback holds the Keras hooks, which note each step and hand over: the train step is
tapped by ``tap.py``, the hooks' steps are numbered and timed by ``fit_steps.py``, the ring's
rows are read, recorded, checked and autopsied by ``recorder.py`` (``Monitor``'s too), the
steps that come with the logs under a strategy are ``logs_fallback.py``'s, and the protective
actions ``protect.py``'s.

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
from typing import Any

import keras

from trainvitals.agent import tf_vitals
from trainvitals.agent.bad_step import BadStep
from trainvitals.agent.callback_arguments import CallbackArguments
from trainvitals.agent.config import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_READ_INTERVAL,
    DEFAULT_RING_CAPACITY,
    AgentConfig,
    generate_run_name,
    resolve,
)
from trainvitals.agent.fit_steps import FitSteps
from trainvitals.agent.fitcall import FitCall
from trainvitals.agent.logs_fallback import LogsFallback, numbers_in
from trainvitals.agent.packing import Pivot
from trainvitals.agent.protect import Guard, Protection
from trainvitals.agent.recorder import Evidence, Recorder
from trainvitals.agent.run import Run
from trainvitals.agent.sampler import Source
from trainvitals.agent.tap import TrainStepTap
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import EndReason
from trainvitals.series import EPOCH, EPOCH_PREFIX, VAL_PREFIX

log = logging.getLogger("trainvitals")


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

    Used for several fits of a model (folds, stages, a little more training at each turn of a
    loop), the callback traces its train step once: each fit with it takes back the step the
    previous one traced, unless a recompile or a new ``steps_per_execution``, ``jit_compile``
    or ``run_eagerly`` calls for a new one (each trace costs a fraction of a second, and
    memory TensorFlow never gives back). Between fits, and in any fit without it, the model
    runs its own train step.

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
        self._arguments = CallbackArguments(
            **{name: value for name, value in given.items() if name not in ("self", "__class__")}
        )
        if config is not None:
            self._arguments.config = dict(config)  # as resolve() takes it
        super().__init__()
        self._settings = resolve(
            server, project, run_name, token, config, flush_interval, read_interval=read_interval
        )
        self._vitals = StepVitals(grad_norms_every)
        self._fits = 1  # the fits this callback has made runs of, for numbering their names
        self.run: Run | None = None
        # The fit's parts, made at its start: the tap on its train step, its steps, the
        # steps that come with the logs where there is no ring, and what records the rows.
        self._tap: TrainStepTap | None = None
        self._steps: FitSteps | None = None
        self._fallback: LogsFallback | None = None
        self._recorder: Recorder | None = None
        # Held by whoever reads the ring or hands steps over, and while a fit's state is
        # replaced (re-entrant: the looks and the ending of a left fit flush under it).
        self._read_lock = threading.RLock()
        # The fit call under way (None: a loop of the script's own calls the hooks), whether
        # a look has seen it left, and the run whose looks read the ring now.
        self._fit: FitCall | None = None
        self._fit_gone = False
        self._looking: Run | None = None

    @property
    def guard(self) -> Guard | None:
        """The protective actions (``protect=``) of the fit under way, or of the last one
        (None once a fit that an exception left is over: nothing to stop or restore)."""
        return self._recorder.guard if self._recorder is not None else None

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
        cls = type(self)
        made = cls.__new__(cls)
        memo[id(self)] = made
        VitalsCallback.__init__(made, **vars(self._arguments.again(memo, deep)))
        for name, value in vars(self).items():
            if name not in vars(made):
                setattr(made, name, copy.deepcopy(value, memo) if deep else value)
        return made

    # Keras may call on_train_batch_end from a thread pool, several at once and out of order
    # (with the TensorFlow backend it calls it on the training thread): that hook only reads
    # the logs it is given and appends to a locked list; the pivot sorts what it takes.
    async_safe = True

    def set_model(self, model: Any) -> None:
        """Keras's hook, called as ``fit`` builds its callbacks, before it asks for the train
        function: where this callback's previous fit of ``model`` tapped a train step that
        still serves, that step is put back (:meth:`TrainStepTap.resume`), so that a loop of
        fits traces it once (each trace costs TensorFlow memory it never gives back)."""
        super().set_model(model)
        tap = self._tap
        if tap is None or tap.model is not model:
            return
        if self._fit is not None and self._fit.running():
            return  # set during this callback's own fit (an evaluate given it, say)
        try:
            fit = FitCall.find(model)
            if fit is None:
                return
            callbacks = fit.argument("callbacks")
            # This very fit's callbacks, as it builds them (not a fit of another callback
            # that hands this one to evaluate or predict).
            ours = isinstance(callbacks, (list, tuple)) and any(c is self for c in callbacks)
            if not (ours and tap.resume(fit, *self._tap_settings(model))):
                fit.forget()
        except Exception as exc:  # the fit traces a tapped step of its own
            log.warning(
                "trainvitals: the tapped train step is traced again (%s: %s)",
                type(exc).__name__,
                exc,
            )

    def _tap_settings(self, model: Any) -> tuple[int, bool, bool]:
        """The ring's capacity, whether a step raises the NaN/Inf flag, whether it keeps a bad
        step: what the tapped step of a fit of ``model`` is traced with."""
        # Room for two executions at least: the hook reads between executions only.
        per_execution = int(getattr(model, "steps_per_execution", 1) or 1)
        capacity = max(int(self._arguments.ring_capacity), 2 * per_execution)
        return capacity, self._arguments.protect is not None, BadStep.possible(model)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        previous = self._tap
        with self._read_lock:  # this callback's previous fit, left by an exception just now
            self._end_left_fit()
            # No look reads while this fit is set up.
            self._looking, self._tap, self._recorder = None, None, None
        arguments = self._arguments
        fit = FitCall.find(self.model)
        params = {k: v for k, v in (self.params or {}).items() if k in ("epochs", "steps")}
        guard = Guard(arguments.protect, self.model) if arguments.protect is not None else None
        self.run = run = Run(
            self._next_settings(params),
            system_metrics=arguments.system_metrics,
            gpu=arguments.gpu,
            env=tf_vitals.describe(self.model, fit.argument("x") if fit is not None else None),
            watchdog=arguments.watchdog,
            on_system=guard.on_system if guard is not None else None,
            notebook=arguments.notebook,
        )
        with self._read_lock:  # the looks begin: they ask after the fit, and read no ring yet
            self._fit, self._fit_gone, self._looking = fit, False, run
        run.start()
        run.on_tick(functools.partial(self._look_for, run))  # a hung run's steps too
        weights_every = int(arguments.weights_every)
        weights = tf_vitals.WeightsCheck.create(self.model) if weights_every else None
        if previous is not None and previous.resumed():
            tap = previous  # put back by set_model: its step was traced by an earlier fit
        else:
            if previous is not None and previous.model is self.model:
                previous.remove()  # resumed, and its function replaced since: not to be wrapped
            capacity, flag_nonfinite, keep_bad_step = self._tap_settings(self.model)
            tap = TrainStepTap(
                self.model,
                capacity,
                flag_nonfinite=flag_nonfinite,
                fit=fit,
                bad_step=BadStep() if keep_bad_step else None,
            )
        steps = FitSteps(tap, int(params.get("steps") or 0))  # 0: Keras does not know
        # Whether the weights were already NaN/Inf as fit began (a restored checkpoint, an
        # earlier fit): the autopsy tells that from weights an update poisoned.
        poisoned_at_start = bool(weights and weights.first > 0)

        def evidence(step: int) -> Evidence:
            kept = tap.bad_step.take() if tap.bad_step is not None else None
            return Evidence(kept=kept, poisoned_at_start=poisoned_at_start)

        recorder = Recorder(
            run, self.model, self._vitals, steps, evidence, weights, weights_every, guard
        )
        read_interval = self._settings.read_interval
        fallback = LogsFallback(steps, self._vitals, read_interval, guard is not None)
        if tap is previous:
            tap.rewind(fit)
        else:
            tap.install()
        with self._read_lock:  # the looks read its ring from now on
            self._tap, self._steps, self._fallback, self._recorder = tap, steps, fallback, recorder

    def _next_settings(self, params: dict[str, int]) -> AgentConfig:
        """This fit's run's settings: ``fit``'s epochs and steps in its config, and a name of
        its own when the callback is used again (a second fit, a fine-tune)."""
        settings = replace(self._settings, config={**params, **self._settings.config})
        if self.run is not None and self._arguments.run_name is None:
            # A name generated for each fit: every run would have the same one otherwise.
            settings = replace(settings, run_name=generate_run_name())
        elif self.run is not None:
            # A name given once, used again: numbered, so the runs list tells the fits apart.
            self._fits += 1
            settings = replace(settings, run_name=f"{settings.run_name}-{self._fits}")
        return settings

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._steps is not None:
            self._steps.epoch_began()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.guard is not None:
            self.guard.before_step()
        if self._steps is not None:
            self._steps.batch_began(batch)  # a list append, no lock

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        flagged = TrainStepTap.take_flag(logs)
        packed = TrainStepTap.take(logs)
        tap, steps, fallback = self._tap, self._steps, self._fallback
        if self.run is None or tap is None or steps is None or fallback is None:
            return
        step = steps.step_of(batch)
        now = time.monotonic()
        ring = tap.ring
        if ring is not None:
            # The step's vitals and metrics are in the device ring: note when it ended, and
            # read the ring here only when half of it is unread (a hook's whole work).
            steps.ended(step, now)
            if self.guard is not None:
                self.guard.after_step(step)
            if flagged or step - ring.read_upto >= ring.capacity // 2:
                self._flush_pending()  # a NaN/Inf step, with protect=, is acted on at once
            return
        # No ring (a model or strategy the tap could not give one): the vector, if any, and
        # Keras's numbers come with the logs of the last step of each execution.
        if self.guard is not None:
            self.guard.after_step(step)
        batch_due = fallback.add(step, now, packed, logs, tap.measured)
        if batch_due is not None:
            with self._read_lock:
                self._record(batch_due)

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
        """The sender's look, every ``read_interval`` (:meth:`Recorder.look`); the hang
        detector learns of every step at each look. A fit that an exception left ends its run
        (:meth:`_left_fit`). Called with the read lock held."""
        if self._left_fit():
            return
        tap, recorder = self._tap, self._recorder
        if tap is None or recorder is None:
            return
        if tap.ring is None:
            self._flush_pending()
        else:
            recorder.look(tap.ring, tap.measured)

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
            self._stop_guarding()  # nothing to stop or restore: that fit is over
            self._flush_pending(upto=self._last_step())
        return True

    def _end_left_fit(self) -> None:
        """End the run of a fit that an exception left (on the sender's thread, or on the
        training thread at this callback's next fit): its steps so far, then ``signal:SIGINT``
        if Ctrl-C (a notebook's interrupt) came during it, else ``exception``, with the
        traceback where it can still be seen (a notebook shows it). Without this the process,
        which lives on, kept the run ``running``. The model keeps the tap until the next fit
        (or ``train_on_batch``) takes it off, or, a fit with this callback, resumes it
        (``TrainStepTap``). Called with the read lock held."""
        fit, run = self._fit, self.run
        if fit is None or run is None:
            return
        self._fit = None
        self._stop_guarding()  # nothing to stop or restore: that fit is over
        error = None
        try:
            error = fit.exception()
            self._flush_pending(upto=self._last_step())
        except Exception:  # the run ends all the same
            log.exception("trainvitals: the last steps of a fit left by an exception are lost")
        finally:
            self._looking = None  # the ring is a later fit's from now on
            reason, text = fit.ending(error)
            fit.forget()
            log.warning("trainvitals: fit() was left by an exception; run %r ends as %s",
                        run.config.run_name, reason)  # fmt: skip
            run.finish(reason, text, timeout=0)  # the sender sends it: no wait here

    def _stop_guarding(self) -> None:
        if self._recorder is not None:
            self._recorder.guard = None

    def _last_step(self) -> int:
        return self._steps.last if self._steps is not None else 0

    def _flush_pending(self, upto: int | None = None) -> None:
        """Hand over every step recorded so far (the training thread calls this when half
        the ring is unread, at a NaN/Inf step with ``protect=``, and at each epoch's end;
        without a ring, the sender at each look); from the ring, none after step ``upto``."""
        tap, recorder, fallback = self._tap, self._recorder, self._fallback
        if tap is None or recorder is None or fallback is None:
            return
        with self._read_lock:  # blocks go to the run in step order, whoever reads
            if tap.ring is not None:
                recorder.stage(tap.ring, upto)
                recorder.hand_over(tap.ring, tap.measured)
                return
            batch = fallback.take(tap.measured)
            if batch is not None:
                self._record(batch)

    def _record(self, batch: Pivot) -> None:
        if self._recorder is not None:
            self._recorder.record(batch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        TrainStepTap.take(logs)
        self._flush_pending()  # Keras has delivered every batch end of the epoch by now
        ring = self._tap.ring if self._tap is not None else None
        if ring is not None and self._steps is not None:
            self._steps.epoch_read(ring.read_upto)
        values = numbers_in(logs)
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
