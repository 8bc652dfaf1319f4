"""The first bad step's batch and weights, kept for its autopsy.

``fit`` consumes each batch inside its compiled step, and by the time the host sees that a
step's loss or gradients were NaN/Inf, the optimizer has applied them: the batch is gone and
the weights may be poisoned. To replay that step as it was, the tap asks :class:`BadStep` to
add one conditional to the traced step, before the update: when the loss or a gradient is
not finite, it copies the batch and the weights to the host. A healthy step only tests the
sum it already computes for the vitals; the copy runs in a branch it never takes.

Imports TensorFlow: load it lazily.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from trainvitals.agent import tf_vitals

__all__ = ["BadStep", "Kept"]


@dataclass(frozen=True)
class Kept:
    """What the first bad step had before its update: its data as ``train_step`` received it
    (``(x, y, sample_weight)`` or the like, as arrays) and ``model.weights``' values."""

    data: Any
    weights: list[np.ndarray]


class BadStep:
    """Keeps the first step whose loss or gradients are NaN/Inf (see the module's docstring).

    Example:
        ```python
        bad = BadStep()
        bad.watch(data, loss, squares, model.weights)   # while the step is traced
        ...
        kept = bad.take()                               # on the host, after a bad step
        ```
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: Kept | None = None

    @staticmethod
    def possible(model: Any) -> bool:
        """Whether a step of ``model`` can keep its batch: not under XLA (no host call there),
        not on a GPU (the test would wait for the device at every step), not under a strategy
        of several replicas."""
        return not (
            bool(getattr(model, "jit_compile", False))
            or tf_vitals.has_gpu()
            or tf_vitals.distributed()
        )

    def watch(self, data: Any, loss: Any, squares: Any, variables: list[Any], scaled: bool) -> Any:
        """Add the conditional copy to the step being traced, and return its output (None
        when the data cannot be kept): the step's vitals wait for it, so that a bad step is
        never seen on the host before its copy is. ``squares`` are the gradients' sums of
        squares (computed for the vitals anyway); ``scaled``: a loss-scale optimizer skips
        steps whose gradients overflow, so there only the loss is tested."""
        leaves = tf.nest.flatten(data)
        if loss is None or not all(leaf is None or isinstance(leaf, tf.Tensor) for leaf in leaves):
            return None  # ragged, sparse or odd data: the autopsy works from the vitals
        present = [i for i, leaf in enumerate(leaves) if leaf is not None]
        parts = [tf.reduce_mean(tf.cast(loss, tf.float32))]
        if not scaled:
            parts.append(tf.reduce_sum(squares))
        checksum = tf.add_n(parts)

        def keep(*tensors: Any) -> Any:
            with self._lock:
                if self._kept is None:
                    arrays: list[Any] = list(leaves)
                    for index, tensor in zip(present, tensors[: len(present)], strict=True):
                        arrays[index] = tensor.numpy()
                    weights = [t.numpy() for t in tensors[len(present) :]]
                    self._kept = Kept(tf.nest.pack_sequence_as(data, arrays), weights)
            return np.int32(0)

        def copy() -> Any:
            tensors = [leaves[i] for i in present] + [tf.identity(v) for v in variables]
            return tf.reshape(tf.py_function(keep, tensors, Tout=tf.int32), [])

        return tf_vitals.keep_conditional(
            tf.cond(tf.math.is_finite(checksum), lambda: tf.constant(0, tf.int32), copy)
        )

    def rewind(self) -> None:
        """Forget the kept step: the next fit keeps its own first bad one."""
        with self._lock:
            self._kept = None

    def take(self) -> Kept | None:
        """The kept step: the first bad one (None if no step was bad, or it could not be kept)."""
        with self._lock:
            return self._kept
