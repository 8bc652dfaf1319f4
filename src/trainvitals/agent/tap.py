"""The train-step tap: make a Keras model's compiled train step also record the vitals.

``model.fit`` runs its steps inside a compiled function the callback cannot enter. So, before
that function is traced, the tap wraps three methods on the instances: ``compute_loss`` (to
capture the loss tensor), the optimizer's ``apply`` (to see the gradients, the loss scale and
the learning rate) and ``train_step`` (to compute the packed vector of
``tf_vitals.step_vitals`` and write it, with Keras's metrics, into the device ring of
:mod:`trainvitals.agent.ring`). Nothing is added to what Keras fetches per step. Where there
can be no ring (a strategy with several replicas), the vector rides in the logs instead, as
one more output. :meth:`TrainStepTap.remove` puts the model back as it was; a tap whose
``fit`` an exception left (Keras then skips ``on_train_end``) is removed when the next ``fit``
asks for its train function, unless that fit resumes it, or by the next tap installed on the
model.

TensorFlow keeps some memory of every trace for good, and a trace takes a good part of a
second: a loop of fits (folds, stages, a little more training at each turn of a loop) must not
trace the tapped step again at each fit. So the tap keeps its traced function when it is
removed, and :meth:`TrainStepTap.resume` puts it back for a later fit with the same callback,
when nothing the trace captured has changed; :meth:`TrainStepTap.rewind` then empties the ring
and the bad step's copy, so that the fit counts its own steps from 1.

Imports TensorFlow (through ``tf_vitals``): load it lazily.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

import tensorflow as tf

from trainvitals.agent import packing, tf_env, tf_vitals
from trainvitals.agent.bad_step import BadStep
from trainvitals.agent.config import DEFAULT_RING_CAPACITY
from trainvitals.agent.fitcall import FitCall
from trainvitals.agent.packing import Measured
from trainvitals.agent.ring import DeviceRing
from trainvitals.series import CHANCE_LOSS, LOSS

log = logging.getLogger("trainvitals")

#: The key the packed vector rides under in Keras's logs; :meth:`TrainStepTap.take` removes
#: it before Progbar or History see it.
VITALS_KEY = "trainvitals/vitals"
#: The key of the step's NaN/Inf flag in the logs, when asked for (``flag_nonfinite``).
NONFINITE_KEY = "trainvitals/nonfinite"
#: The model's attribute (outside Keras's tracking) naming the tap installed on it.
_INSTALLED = "_trainvitals_tap"

#: What a traced ``train_step`` returns: Keras's metrics by name, as tensors or numbers, in
#: nested dicts where a step written as Keras's guide shows returns them so.
StepLogs: TypeAlias = "Mapping[str, tf.Tensor | float | StepLogs]"


@dataclass
class _Captured:
    """What one trace of the train step handed the wrappers (tensors of that trace)."""

    data: Any = None
    loss: Any = None
    grads: list[Any] | None = None
    squares: Any = None
    kept: Any = None  # the bad step's copy, which the vitals wait for
    scale: Any = None
    lr: Any = None
    names: tuple[str, ...] = field(default=())


class TrainStepTap:
    """Wraps ``model``'s train step so that it also records the step's packed vitals.

    :attr:`measured` says what the traced step could measure (set while it is traced);
    :attr:`ring` is where it writes them (None: they ride in the logs).

    Example:
        ```python
        tap = TrainStepTap(model)
        tap.install()                      # before fit traces its train function
        ...                                # each step writes its row of tap.ring
        numbers, rows = tap.ring.read()    # now and then, on any thread
        tap.remove()                       # at the end of fit
        ...                                # the next fit, as it builds its callbacks:
        tap.resume(fit, capacity, flag_nonfinite=False, bad_step=True)
        tap.rewind(fit)                    # as it begins: its steps from 1
        ```
    """

    def __init__(
        self,
        model: Any,
        capacity: int = DEFAULT_RING_CAPACITY,
        flag_nonfinite: bool = False,
        fit: FitCall | None = None,
        bad_step: BadStep | None = None,
    ) -> None:
        self.model = model
        #: The ``fit`` call the tap is for (None: a loop of the script's own calls the hooks).
        self.fit = fit
        self.capacity = capacity
        #: Also put one scalar in each step's logs, non-zero when a value of the step is not
        #: finite, for a caller that must act at that very step (``Protection``): Keras
        #: converts it with the logs it fetches anyway.
        self.flag_nonfinite = flag_nonfinite
        self.measured = Measured()
        #: Keeps the first bad step's batch and weights for the autopsy (None: no keeping).
        self.bad_step = bad_step
        #: Where the traced step keeps each step's vector (None: it rides in the logs).
        self.ring: DeviceRing | None = None
        # The wrappers, made once (install) and put back as they are (resume): a step traced
        # again, for a batch of a new shape, calls the ones the first trace captured.
        self._wrappers: list[tuple[object, str, Callable[..., Any]]] = []
        self._attached = False
        #: The tapped train function, and the model's own that it replaced (given back by
        #: remove, as Keras's cache holds it: Keras makes it again after a recompile).
        self._function: Any = None
        self._plain: Any = None
        self._traced_with: tuple[Any, ...] = ()

    def install(self) -> None:
        """Wrap the methods and rebuild the train function. A model the tap cannot wrap
        still trains, without the in-step vitals, after one warning."""
        model = self.model
        left = vars(model).get(_INSTALLED)
        if left is not None and left is not self and left.fit and not left.fit.running():
            # The tap of a fit that an exception left (on_train_end never came): the model's
            # own methods first, then this fit's wrappers, not wrappers around wrappers.
            left.remove()
        # The model's own train function, given back by remove() (not another tap's, of a
        # callback of the same fit: that one gives back its own).
        self._plain = model.train_function if _INSTALLED not in vars(model) else None
        self._traced_with = _traced_with(model)
        optimizer = getattr(model, "optimizer", None)
        captured = _Captured()
        try:
            compute_loss, train_step = model.compute_loss, model.train_step

            @functools.wraps(compute_loss)
            def capturing_compute_loss(*args: Any, **kwargs: Any) -> Any:
                captured.loss = loss = compute_loss(*args, **kwargs)
                return loss

            @functools.wraps(train_step)
            def reporting_train_step(data: Any, *args: Any, **kwargs: Any) -> Any:
                nonlocal captured
                captured = _Captured(data=data)
                logs = train_step(data, *args, **kwargs)
                # Python runs here once, while the step is traced: this says what it measures.
                has_grads = captured.grads is not None
                self.measured = Measured(
                    loss=captured.loss is not None,
                    grads=has_grads,
                    names=captured.names if has_grads else (),
                    lr=captured.lr is not None,
                    loss_scale=captured.scale is not None,
                )
                if isinstance(logs, dict):
                    try:
                        vitals = tf_vitals.step_vitals(
                            captured.loss,
                            data,
                            captured.grads,
                            captured.scale,
                            captured.lr,
                            captured.squares,
                        )
                        if captured.kept is not None:
                            with tf.control_dependencies([captured.kept]):
                                vitals = tf.identity(vitals)
                    except Exception as exc:  # a step of a shape never seen: Keras's own
                        log.warning(
                            "trainvitals: in-step vitals unavailable for this train step (%s: %s)",
                            type(exc).__name__,
                            exc,
                        )
                        self.measured = Measured()
                        return logs
                    if not self._into_ring(vitals, logs, data):
                        logs = {**logs, VITALS_KEY: vitals}
                    elif self.flag_nonfinite:
                        flag = tf_vitals.nonfinite_flag(vitals, packing.suspect(self.measured))
                        logs = {**logs, NONFINITE_KEY: flag}
                return logs

            wrappers: list[tuple[object, str, Callable[..., Any]]] = [
                (model, "compute_loss", capturing_compute_loss),
                (model, "train_step", reporting_train_step),
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
                    captured.names = tuple(
                        tf_vitals.variable_name(v, i) for i, v in enumerate(variables)
                    )
                    captured.grads = grads
                    captured.scale = tf_vitals.loss_scale_of(optimizer)
                    # Read before the update moves the iteration: this step's rate.
                    captured.lr = tf_vitals.learning_rate_of(optimizer)
                    if self.bad_step is not None:
                        self._watch(captured, model)
                    return apply(grads, trainable_variables)

                wrappers.append((optimizer, "apply", measuring_apply))
            if self.fit is not None:
                make_train_function = model.make_train_function

                @functools.wraps(make_train_function)
                def untapping_make_train_function(force: bool = False) -> Any:
                    # Keras asks for the train function at the start of every fit (and of
                    # each train_on_batch), on the training thread, before on_train_begin.
                    # A fit that an exception left never came to on_train_end: a later fit
                    # without this tap's callback would run the tapped step, writing rows into
                    # a ring no one reads. The training thread takes the tap off here, where
                    # no step can be running (the sender's thread could pull the function from
                    # under a fit that had just begun). A fit with the callback has resumed
                    # the tap (set_model comes first): its fit is the one running.
                    if self.fit is not None and not self.fit.running():
                        self.remove()
                        return model.make_train_function(force)
                    return make_train_function(force)

                wrappers.append((model, "make_train_function", untapping_make_train_function))
            self._wrappers = wrappers
            self._attach()
            model.make_train_function(force=True)
            self._function = model.train_function
        except Exception as exc:  # an unusual model must still train
            log.warning(
                "trainvitals: in-step vitals unavailable for this model (%s: %s)",
                type(exc).__name__,
                exc,
            )
            self.remove()

    def _watch(self, captured: _Captured, model: Any) -> None:
        """Before the update: the sums of squares the vitals need, and the bad step's copy."""
        assert self.bad_step is not None and captured.grads is not None
        try:
            captured.squares = tf_vitals.squared_norms(captured.grads)
            captured.kept = self.bad_step.watch(
                captured.data,
                captured.loss,
                captured.squares,
                list(model.weights),
                scaled=captured.scale is not None,
            )
        except Exception as exc:  # the autopsy then works from the vitals
            log.info("trainvitals: the bad step's batch cannot be kept (%s)", exc)

    def _into_ring(self, vitals: tf.Tensor, logs: StepLogs, data: Any) -> bool:
        """Write the step's vector and Keras's scalar metrics (and a regression's loss at
        chance on the batch ``data``) into the device ring (made at the first trace); False
        where there can be no ring: then the vector rides in the logs, and only the last step
        of each execution is seen."""
        if tf_vitals.distributed():
            return False  # a replica's write to one plain variable: not under a strategy
        try:
            chance = _chance(self.model, data)
            named = logs if chance is None else {**logs, CHANCE_LOSS: chance}
            names, row = tf_vitals.with_metrics(vitals, named, skip=LOSS)
            width = int(row.shape[0])
            if self.ring is None or self.ring.width != width:
                self.ring = DeviceRing(width, self.capacity)
            self.ring.write(row)
        except Exception as exc:  # an unusual step: the vector rides in the logs instead
            log.warning(
                "trainvitals: vitals sent with the logs, not kept on the device (%s: %s)",
                type(exc).__name__,
                exc,
            )
            self.ring = None
            return False
        self.measured = replace(self.measured, metrics=names)
        return True

    def resume(self, fit: FitCall, capacity: int, flag_nonfinite: bool, bad_step: bool) -> bool:
        """Put the wrappers and the tapped train function back on the model for ``fit``, a
        later fit of the same callback, if they still serve it: the same ring capacity, the
        same NaN/Inf flag, a bad step kept or not as before, and what the trace captured
        unchanged (the optimizer, ``steps_per_execution``, ``jit_compile``, ``run_eagerly``,
        the strategy, and the model's own train function, which Keras drops at a recompile).
        Call it before Keras asks for the train function (``set_model``); False, and nothing
        done, when a new tap must be traced."""
        model = self.model
        installed = vars(model).get(_INSTALLED)
        current = model.train_function
        if self._attached:
            # Left on by a fit that an exception left: resumed if nothing replaced it since.
            usable = installed is self and current is self._function
        else:
            usable = installed is None and self._plain is not None and current is self._plain
        if not (
            usable
            and self._function is not None
            and self.capacity == capacity
            and self.flag_nonfinite == flag_nonfinite
            and (self.bad_step is not None) == bad_step
            and _same(self._traced_with, _traced_with(model))
        ):
            return False
        self.fit = fit
        if not self._attached:
            self._attach()
            model.train_function = self._function
        return True

    def resumed(self) -> bool:
        """Whether :meth:`resume` put the tap back for the fit that runs now, and Keras took
        its train function."""
        return (
            self._attached
            and self.model.train_function is self._function
            and self.fit is not None
            and self.fit.running()
        )

    def rewind(self, fit: FitCall | None) -> None:
        """Ready the resumed tap for ``fit``'s steps (the call :meth:`resume` was given, as
        the callback found it again): an empty ring counting from 1, and no bad step kept. On
        the training thread, before the fit's first step, once no one reads the previous
        fit's rows."""
        if fit is not None and fit is not self.fit:
            if self.fit is not None:
                self.fit.forget()
            self.fit = fit
        if self.ring is not None:
            self.ring.rewind()
        if self.bad_step is not None:
            self.bad_step.rewind()

    def remove(self) -> None:
        """Put the model's own methods and train function back (harmless when nothing is
        wrapped). The tap keeps its traced function, for :meth:`resume`."""
        model = self.model
        if vars(model).get(_INSTALLED) is self:
            vars(model).pop(_INSTALLED)
        if not self._attached:
            return
        self._attached = False
        for owner, name, function in self._wrappers:
            # Only this tap's own: another callback's tap of the same fit wrapped these.
            if vars(owner).get(name) is function:
                vars(owner).pop(name)
        # A later fit without the tap must not run the instrumented step: the model's own
        # function back, unless something has replaced the tapped one since (a recompile
        # dropped it, another tap wrapped it); then Keras makes one anew.
        current = model.train_function
        if current is self._function and current is not None:
            model.train_function = self._plain
        elif current is not self._plain:
            model.train_function = None

    def _attach(self) -> None:
        for owner, name, function in self._wrappers:
            # Bypass Keras's attribute tracking: plain functions, not layers or variables.
            object.__setattr__(owner, name, function)
        self._attached = True
        object.__setattr__(self.model, _INSTALLED, self)

    @staticmethod
    def take(logs: MutableMapping[str, Any] | None) -> Any:
        """Remove the step's packed vector (and NaN/Inf flag) from Keras's logs and return
        the vector (None if absent)."""
        if logs is None:
            return None
        logs.pop(NONFINITE_KEY, None)
        return logs.pop(VITALS_KEY, None)

    @staticmethod
    def take_flag(logs: MutableMapping[str, Any] | None) -> bool:
        """Remove the step's NaN/Inf flag from Keras's logs: whether it was raised."""
        return bool(logs and logs.pop(NONFINITE_KEY, 0))


def _chance(model: Any, data: Any) -> Any:
    """A regression's loss at chance on this step's batch (:func:`tf_env.chance_of_regression
    <trainvitals.agent.tf_env.chance_of_regression>`), or None: another kind of model, or a
    batch it cannot be read from (the step itself goes on as ever)."""
    loss = tf_env.regression_loss(model)
    if loss is None:
        return None
    try:
        return tf_env.chance_of_regression(loss, data)
    except Exception as exc:  # a level for one rule, never a reason to fail the step
        log.info("trainvitals: no loss at chance for this regression (%s)", exc)
        return None


def _traced_with(model: Any) -> tuple[Any, ...]:
    """What a trace of ``model``'s train step captured that a fit may change without a
    recompile."""
    return (
        getattr(model, "optimizer", None),
        getattr(model, "distribute_strategy", None),
        getattr(model, "steps_per_execution", 1),
        getattr(model, "jit_compile", False),
        getattr(model, "run_eagerly", False),
    )


def _same(traced: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    # Objects by identity (a new optimizer of equal settings has variables of its own).
    return len(traced) == len(now) and all(
        a is b or (isinstance(a, (bool, int, str)) and a == b)
        for a, b in zip(traced, now, strict=True)
    )
