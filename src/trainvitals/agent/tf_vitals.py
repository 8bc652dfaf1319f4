"""Training vitals as TensorFlow ops: NaN/Inf counts and gradient norms.

Used inside the compiled train step by :class:`~trainvitals.VitalsCallback` (so the values
reach the host with the logs Keras fetches anyway) and eagerly by
:class:`~trainvitals.Monitor` in custom loops. Imports TensorFlow: load it lazily.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from trainvitals.agent import packing
from trainvitals.agent.ring import DeviceRing

# What the run's hello says about TensorFlow lives in tf_env; importable from here as before.
from trainvitals.agent.tf_env import TensorflowEnv as TensorflowEnv
from trainvitals.agent.tf_env import Worker as Worker
from trainvitals.agent.tf_env import describe as describe
from trainvitals.agent.tf_env import has_gpu as has_gpu
from trainvitals.agent.tf_env import input_kinds as input_kinds
from trainvitals.agent.tf_env import variable_name as variable_name
from trainvitals.series import NONFINITE_GRADS, NONFINITE_INPUTS, NONFINITE_LOSS

log = logging.getLogger("trainvitals")


def _dense(tensor: Any) -> Any:
    """The values of ``tensor`` as one dense tensor: an embedding's gradient (IndexedSlices),
    a ragged or a sparse tensor keep their values in a dense tensor of their own."""
    if isinstance(tensor, tf.IndexedSlices):  # embedding gradients
        return tensor.values
    if isinstance(tensor, tf.RaggedTensor):
        return tensor.flat_values
    if isinstance(tensor, tf.SparseTensor):
        return tensor.values
    return tf.convert_to_tensor(tensor)


#: The kinds of value the NaN/Inf counts could not read, each said once (a log line, and the
#: run's environment through :func:`input_kinds`).
_unread: set[str] = set()


def _floating(structure: Any) -> list[Any]:
    """The floating tensors of a (nested) structure. A value of a kind that cannot be read as
    a tensor (another composite tensor, a Python object) is left out after one log line:
    telemetry never fails the step it measures."""
    tensors = []
    for leaf in tf.nest.flatten(structure):
        if leaf is None:
            continue
        try:
            tensor = _dense(leaf)
        except (TypeError, ValueError) as exc:
            kind = type(leaf).__name__
            if kind not in _unread:
                _unread.add(kind)
                log.info("trainvitals: NaN/Inf counts leave out values of type %s (%s)", kind, exc)
            continue
        if tensor.dtype.is_floating:
            tensors.append(tensor)
    return tensors


def nonfinite_count(structure: Any) -> tf.Tensor:
    """NaN/Inf elements across every floating tensor in a (nested) structure, as float32."""
    total = tf.constant(0.0, tf.float32)
    for tensor in _floating(structure):
        total += tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(tensor)), tf.float32))
    return total


class WeightsCheck:
    """NaN/Inf elements in a Keras model's weights, as one compiled TensorFlow function.

    Run every N steps off the training thread. Eagerly, the count is some thirty separate
    operations, each dispatched from Python while holding the interpreter lock that the
    training loop needs too; compiled, it is one call. As in :func:`step_vitals`, a healthy
    model pays for one sum of squares; the exact count runs only when that sum is not finite.
    """

    #: The least time between two checks, in seconds: at hundreds of steps a second, every N
    #: steps would mean several checks a second, for weights that only change by small steps.
    min_interval = 1.0

    def __init__(self, model: Any) -> None:
        self._variables = list(model.weights)
        # A partial, not the bound method: TensorFlow counts traces by the code they run, and
        # each check traces once for its own model, so a script that makes many (a
        # hyper-parameter loop) would be warned of "excessive retracing".
        self._count = tf.function(functools.partial(WeightsCheck._nonfinite, self), autograph=False)
        self._traced: Any = None
        #: The count :meth:`create` took before training began.
        self.first = 0.0
        self._last = -math.inf
        self.clock = time.monotonic

    @classmethod
    def create(cls, model: Any) -> WeightsCheck | None:
        """A check of ``model``'s weights, traced and run once now (before training starts:
        the trace, some 50 ms of CPU on a small CNN, and the first run of what it traced,
        another 20 ms, against well under 1 ms a check after them, would otherwise land on
        the sender thread in the middle of training), or None after one warning if it cannot
        have one."""
        try:
            check = cls(model)
            check.first = check()  # traced at the first call
            return check
        except Exception as exc:  # an unusual model must still train
            log.warning(
                "trainvitals: no NaN/Inf check of the weights (%s: %s)", type(exc).__name__, exc
            )
            return None

    def due(self) -> bool:
        """Whether a check now keeps to :attr:`min_interval` (and counts it as done)."""
        now = self.clock()
        if now - self._last < self.min_interval:
            return False
        self._last = now
        return True

    def _nonfinite(self) -> tf.Tensor:
        tensors = _floating([v.value for v in self._variables])
        checksum = tf.reduce_sum(squared_norms(tensors))
        return keep_conditional(
            tf.cond(
                tf.math.is_finite(checksum),
                lambda: tf.constant(0.0, tf.float32),
                lambda: nonfinite_count(tensors),
            )
        )

    def __call__(self) -> float:
        if not self._variables:
            return 0.0
        if self._traced is None:
            self._traced = self._count.get_concrete_function()
        # The traced function itself: the tf.function's dispatch (its cache's lookup of the
        # call's signature) costs as much again, on the sender thread, once a second.
        return float(self._traced())


def squared_norms(tensors: Sequence[Any]) -> tf.Tensor:
    """Each tensor's sum of squares, as a float32 vector (0 for a missing gradient).

    One ``l2_loss`` op per tensor: one concatenation and a segmented sum, or a ``tensordot``,
    measured several times slower on the benchmark MLP. Reading each gradient once is most of
    what the vitals add to a CPU step (``benchmarks/agent_overhead.py`` times it alone).
    """
    halves = []  # l2_loss is half the sum of squares: one multiplication for all of them
    for tensor in tensors:
        if tensor is None:
            halves.append(tf.constant(0.0, tf.float32))
            continue
        halves.append(_float32(tf.nn.l2_loss(_summed(tensor))))
    return 2.0 * tf.stack(halves) if halves else tf.zeros([0], tf.float32)


def _summed(tensor: Any) -> Any:
    """A gradient's values as the optimizer applies them. An embedding's gradient is
    ``IndexedSlices`` with a row per lookup: an id looked up several times in a batch has
    several rows, which the update adds up. Their squares summed one by one would not be the
    norm of that sum (32 lookups of one id: 0.75 where the gradient's norm is 1.66), so the
    rows of one id are added first, without making the whole table dense."""
    if not isinstance(tensor, tf.IndexedSlices):
        return _dense(tensor)
    ids, row = tf.unique(tensor.indices)
    return tf.math.unsorted_segment_sum(tensor.values, row, tf.shape(ids)[0])


def step_vitals(
    loss: Any,
    inputs: Any,
    grads: Sequence[Any] | None,
    loss_scale: Any = None,
    lr: Any = None,
    squares: Any = None,
) -> tf.Tensor:
    """Everything a step reports, packed into one float32 vector so that fetching it costs one
    transfer: the scalars named in :data:`packing.HEAD <trainvitals.agent.packing.HEAD>`, then
    the per-variable gradient norms (:mod:`~trainvitals.agent.packing` decodes it). ``lr``,
    the optimizer's learning rate for this step (:func:`learning_rate_of`), rides along: a
    scalar more in the vector costs nothing measurable, where a separate read would be a
    host-device round trip.

    Counting NaN/Inf element by element costs more than the norms themselves, and NaN/Inf
    always make a sum of squares non-finite. So the sums of squares (which the norms need
    anyway) are checked, and the exact counts run, inside one ``tf.cond``, only on a step
    that has a NaN or an Inf somewhere. Not on a GPU: there the conditional's predicate
    would be a wait for the device at every step, and the counts run every step instead.

    With gradients, the input batch is not read on a healthy step: a NaN or an Inf among the
    inputs reaches the gradients of the first trainable layer that reads them whatever the
    forward pass did with it (that layer's kernel gradient multiplies every input value it
    reads, and NaN times anything, or Inf times zero, is NaN), so the gradients' checksum
    already catches it, and the exact counts then name the inputs as the origin. Reading the
    batch was the largest read of the vitals on the benchmark's image model (301,056 input
    values against 5,130 weights): its size grows with the batch, the gradients' with the
    model. What goes unreported is a bad value that reached neither the
    loss nor a gradient: one that a layer replaced before any weight saw it, which left
    training as it was. Without gradients, the inputs stay in the checksum.
    """
    # Few operations: no reduction of a scalar loss, one sum for the checksum, one
    # concatenation at the end. (Fewer still, with the square roots on the host, measured
    # within noise of this: the gradients' sums of squares are the cost.)
    zero = tf.constant(0.0, tf.float32)
    loss32 = tf.constant(float("nan")) if loss is None else _mean32(loss)
    input_tensors = _floating(inputs)
    present = [g for g in grads if g is not None] if grads is not None else []
    if squares is None:  # else the gradients' sums of squares, computed before the update
        squares = squared_norms(grads) if grads is not None else tf.zeros([0], tf.float32)
    # The exact counts, by name: stacked in the order of packing.COUNTS.
    exact: dict[str, Callable[[], tf.Tensor]] = {
        NONFINITE_LOSS: lambda: nonfinite_count(loss) if loss is not None else zero,
        NONFINITE_INPUTS: lambda: nonfinite_count(input_tensors),
        NONFINITE_GRADS: lambda: nonfinite_count(present),
    }

    def exact_counts() -> tf.Tensor:
        return tf.stack([exact[name]() for name in packing.COUNTS])

    if has_gpu():
        # On a GPU, an ``If`` reads its predicate on the host: the step could not return
        # before the device had computed the checksum, a wait at every step. There the counts
        # run every step instead: one more read of each gradient (and of the batch), on the
        # device, where reading is cheap.
        counts = exact_counts()
    else:
        # A NaN or Inf anywhere makes this sum non-finite (the mean of a loss with a NaN/Inf
        # in it is NaN or Inf); a finite sum that overflows only costs an exact count.
        parts = [] if grads is None else [tf.reduce_sum(squares)]
        if not present:  # no gradient to show bad inputs: read them
            parts.extend(_float32(tf.nn.l2_loss(tensor)) for tensor in input_tensors)
        if loss is not None:
            parts.append(loss32)
        checksum = tf.add_n(parts) if parts else zero
        counts = keep_conditional(
            tf.cond(
                tf.math.is_finite(checksum),
                lambda: tf.zeros([len(packing.COUNTS)], tf.float32),
                exact_counts,
            )
        )
    if loss_scale is not None:
        squares = squares / tf.square(tf.cast(loss_scale, tf.float32))
    norm = tf.sqrt(tf.reduce_sum(squares)) if grads is not None else tf.constant(float("nan"))
    nan = tf.constant(float("nan"))
    rate = nan if lr is None else _float32(tf.convert_to_tensor(lr))
    scale = nan if loss_scale is None else _float32(tf.convert_to_tensor(loss_scale))
    one = [1]  # the layout of packing.HEAD: loss, counts, global norm, lr, scale; the norms
    head = [tf.reshape(loss32, one), counts, *(tf.reshape(v, one) for v in (norm, rate, scale))]
    return tf.concat([*head, tf.sqrt(squares)], 0)


def with_metrics(
    vector: tf.Tensor, logs: Mapping[str, Any], skip: str
) -> tuple[tuple[str, ...], tf.Tensor]:
    """``vector`` followed by the scalar numbers among a traced step's ``logs`` (Keras's
    metrics), but ``skip``: their names, in order, and the longer vector. Nested dicts are
    read as Keras flattens them for its own logs (a ``train_step`` written as Keras's guide
    shows returns ``{"loss": ..., "compile_metrics": {"mae": ...}}``)."""
    names, values = [], []
    for name, value in _flattened(logs).items():
        if name == skip or not isinstance(value, (tf.Tensor, tf.Variable, float, int)):
            continue
        tensor = tf.convert_to_tensor(value)
        if tensor.shape.rank == 0 and (tensor.dtype.is_floating or tensor.dtype.is_integer):
            names.append(name)
            values.append(tf.reshape(tf.cast(tensor, tf.float32), [1]))
    return tuple(names), tf.concat([vector, *values], 0) if values else vector


def _flattened(logs: Mapping[str, Any]) -> dict[str, Any]:
    """``logs`` with each nested dict's items in its place, by their own names, as Keras's
    ``pythonify_logs`` makes its logs."""
    flat: dict[str, Any] = {}
    for name, value in logs.items():
        if isinstance(value, Mapping):
            flat.update(_flattened(value))
        else:
            flat[name] = value
    return flat


def nonfinite_flag(vector: tf.Tensor, where: tuple[Sequence[int], Sequence[int]]) -> tf.Tensor:
    """1.0 when the packed ``vector`` shows a NaN/Inf (a count above zero, or a value that
    must be finite that is not), else 0.0; ``where`` is :func:`packing.suspect
    <trainvitals.agent.packing.suspect>`'s positions. A few operations on the head only."""
    counts, finite = where
    bad = tf.reduce_any(tf.gather(vector, list(counts)) > 0)
    if finite:
        values = tf.gather(vector, list(finite))
        bad = tf.logical_or(bad, tf.logical_not(tf.reduce_all(tf.math.is_finite(values))))
    return tf.cast(bad, tf.float32)


def distributed() -> bool:
    """Whether a ``tf.distribute`` strategy other than the default one is in scope."""
    return bool(tf.distribute.has_strategy())


def _float32(tensor: Any) -> Any:
    return tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)


def _mean32(loss: Any) -> Any:
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank != 0:
        loss = tf.reduce_mean(loss)
    return _float32(loss)


def keep_conditional(output: tf.Tensor) -> tf.Tensor:
    """Keep the ``tf.cond`` that ``output`` comes from a real conditional call.

    Inside a ``tf.function`` TensorFlow lowers a ``tf.cond`` to switch and merge operations,
    and then each operation of the branch not taken still passes a "dead" value every step.
    Kept as an ``If``, only the branch taken runs: on the benchmark MLP the healthy step's
    counting then costs some 35 µs instead of 60. Eagerly, under XLA, or where TensorFlow's
    graph internals differ, the ``tf.cond`` is left as it is.
    """
    try:
        op = output.op
        while op.type not in ("If", "StatelessIf"):
            if not op.inputs:
                return output
            op = op.inputs[0].op
        op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))
    except Exception:  # an eager tensor has no op; a private API may change
        pass
    return output


class RingWriter:
    """:func:`step_vitals` for the tensors a custom loop hands over, written into a
    :class:`~trainvitals.agent.ring.DeviceRing` without a fetch: compiled, so one call instead
    of some thirty eagerly dispatched operations, and asynchronous where the device is.

    The ring is made at the first call, for that call's layout; a loop whose arguments
    change shape (another set of gradients) needs another writer.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ring: DeviceRing | None = None
        # A partial, not the bound method, as in WeightsCheck: TensorFlow counts the traces of
        # a bound method across instances, and warned of retracing a loop whose writers each
        # traced once.
        self._write = tf.function(
            functools.partial(RingWriter._vitals_into_ring, self),
            reduce_retracing=True,
            autograph=False,
        )

    def _vitals_into_ring(self, loss: Any, inputs: Any, grads: Any, lr: Any) -> tf.Tensor:
        vector = step_vitals(loss, inputs, grads, None, lr)
        if self.ring is None:
            self.ring = DeviceRing(int(vector.shape[0]), self.capacity)
        return self.ring.write(vector)

    def __call__(self, loss: Any, inputs: Any, grads: Sequence[Any] | None, lr: Any = None) -> None:
        def tensor(value: Any) -> Any:
            if value is None or isinstance(value, (tf.Tensor, tf.IndexedSlices, tf.Variable)):
                return value
            return tf.convert_to_tensor(value)  # a number: not a new trace for each value

        self._write(
            tensor(loss),
            tf.nest.map_structure(tensor, inputs),
            None if grads is None else [tensor(g) for g in grads],
            None if lr is None else tf.cast(tensor(lr), tf.float32),
        )


def snapshot(value: Any) -> Any:
    """``value`` as it is now, still on the device: a tensor as it is (it cannot change), a
    variable read now (a later read would see its later values)."""
    return value if isinstance(value, tf.Tensor) else tf.identity(value)


def learning_rate_of(optimizer: Any) -> Any:
    """The learning rate ``optimizer`` applies at its current iteration, as a tensor (a
    ``LearningRateSchedule`` evaluated at ``optimizer.iterations``), or None when it has
    none that is a number. Inside a traced train step this is a few graph operations, and
    read before the update, so it is the rate that very step used."""
    try:
        rate = getattr(optimizer, "learning_rate", None)
        if rate is None:
            return None
        rate = tf.convert_to_tensor(rate)
        return rate if rate.dtype.is_floating and rate.shape.rank == 0 else None
    except Exception:  # an optimizer of its own kind: no learning rate, no warning needed
        return None


def loss_scale_of(optimizer: Any) -> Any:
    """The dynamic loss scale of a Keras ``LossScaleOptimizer``, else None."""
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else tf.convert_to_tensor(scale)
