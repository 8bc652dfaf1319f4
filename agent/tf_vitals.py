"""Training vitals as TensorFlow ops: NaN/Inf counts and gradient norms.

Used inside the compiled train step by :class:`~trainvitals.VitalsCallback` (so the values
reach the host with the logs Keras fetches anyway) and eagerly by
:class:`~trainvitals.Monitor` in custom loops. Imports TensorFlow: load it lazily.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

#: Order of the scalars at the head of the packed vitals vector; per-variable norms follow.
PACKED = ("loss", "nonfinite/loss", "nonfinite/inputs", "nonfinite/grads", "grad/global_norm")


def _dense(tensor: Any) -> Any:
    if isinstance(tensor, tf.IndexedSlices):  # embedding gradients
        return tensor.values
    return tf.convert_to_tensor(tensor)


def _floating(structure: Any) -> list[Any]:
    tensors = (_dense(t) for t in tf.nest.flatten(structure) if t is not None)
    return [t for t in tensors if t.dtype.is_floating]


def nonfinite_count(structure: Any) -> tf.Tensor:
    """NaN/Inf elements across every floating tensor in a (nested) structure, as float32."""
    total = tf.constant(0.0, tf.float32)
    for tensor in _floating(structure):
        total += tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(tensor)), tf.float32))
    return total


def nonfinite_weights(model: Any) -> float:
    """NaN/Inf elements in all of a Keras model's weights (run eagerly, every N steps)."""
    return float(nonfinite_count([w.value for w in model.weights]))


def squared_norms(tensors: Sequence[Any]) -> tf.Tensor:
    """Each tensor's sum of squares, as a float32 vector (0 for a missing gradient).

    One ``l2_loss`` op per tensor: on small models the number of ops, not their size, is what
    a training step pays for.
    """
    squares = []
    for tensor in tensors:
        if tensor is None:
            squares.append(tf.constant(0.0, tf.float32))
            continue
        square = 2.0 * tf.nn.l2_loss(_dense(tensor))
        squares.append(square if square.dtype == tf.float32 else tf.cast(square, tf.float32))
    return tf.stack(squares) if squares else tf.zeros([0], tf.float32)


def step_vitals(
    loss: Any, inputs: Any, grads: Sequence[Any] | None, loss_scale: Any = None
) -> tf.Tensor:
    """Everything a step reports, packed into one float32 vector so that fetching it costs one
    transfer: the scalars named in :data:`PACKED`, then the per-variable gradient norms.

    Counting NaN/Inf element by element costs more than the norms themselves, and NaN/Inf
    always make a sum of squares non-finite. So the sums of squares (which the norms need
    anyway) are checked, and the exact counts run, inside one ``tf.cond``, only on a step
    that has a NaN or an Inf somewhere.
    """
    zero = tf.constant(0.0, tf.float32)
    loss32 = (
        tf.constant(float("nan")) if loss is None else tf.cast(tf.reduce_mean(loss), tf.float32)
    )
    input_tensors = _floating(inputs)
    present = [g for g in grads if g is not None] if grads is not None else []
    squares = squared_norms(grads) if grads is not None else tf.zeros([0], tf.float32)
    checksum = tf.reduce_sum(squared_norms(input_tensors)) + tf.reduce_sum(squares)
    if loss is not None:
        checksum += tf.reduce_sum(tf.cast(loss, tf.float32))
    counts = tf.cond(
        tf.math.is_finite(checksum),
        lambda: tf.zeros([3], tf.float32),
        lambda: tf.stack(
            [
                nonfinite_count(loss) if loss is not None else zero,
                nonfinite_count(input_tensors),
                nonfinite_count(present),
            ]
        ),
    )
    if loss_scale is not None:
        squares = squares / tf.square(tf.cast(loss_scale, tf.float32))
    norm = tf.sqrt(tf.reduce_sum(squares)) if grads is not None else tf.constant(float("nan"))
    head = tf.stack([loss32, counts[0], counts[1], counts[2], norm])
    return tf.concat([head, tf.sqrt(squares)], axis=0)


def unpack(packed: Any) -> tuple[dict[str, float], Any]:
    """A fetched :func:`step_vitals` vector as ``({name in PACKED: value}, per-variable norms)``
    (the norms stay a numpy array: they are only turned into points when they are due)."""
    vector = np.asarray(packed)
    head = dict(zip(PACKED, vector[: len(PACKED)].tolist(), strict=True))
    return head, vector[len(PACKED) :]


def loss_scale_of(optimizer: Any) -> Any:
    """The dynamic loss scale of a Keras ``LossScaleOptimizer``, else None."""
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else tf.convert_to_tensor(scale)


def variable_name(variable: Any, index: int) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", None) or index)


def describe(model: Any = None) -> dict[str, Any]:
    """What TensorFlow says about the build and the devices, for the run's ``hello``."""
    env: dict[str, Any] = {"tensorflow": tf.__version__}
    try:
        build = tf.sysconfig.get_build_info()
        env["tf_build"] = {
            k: build[k] for k in ("cuda_version", "cudnn_version", "is_cuda_build") if k in build
        }
    except Exception:  # very old or exotic builds
        pass
    gpus = tf.config.list_physical_devices("GPU")
    env["tf_gpus"] = [gpu.name for gpu in gpus]
    growth: dict[str, bool | None] = {}
    for gpu in gpus:
        try:
            growth[gpu.name] = bool(tf.config.experimental.get_memory_growth(gpu))
        except Exception:
            growth[gpu.name] = None
    env["memory_growth"] = growth
    try:
        import keras

        env["mixed_precision_policy"] = keras.config.dtype_policy().name
    except Exception:
        pass
    worker = _worker_from_tf_config(os.environ.get("TF_CONFIG"))
    if worker:
        env["worker"] = worker
    if model is not None:
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None:
            env["distribution_strategy"] = type(strategy).__name__
            env["replicas"] = int(getattr(strategy, "num_replicas_in_sync", 1))
        env["jit_compile"] = bool(getattr(model, "jit_compile", False))
    return env


def _worker_from_tf_config(text: str | None) -> dict[str, Any] | None:
    """This process's place in a multi-worker job, from ``TF_CONFIG``."""
    if not text:
        return None
    try:
        task = json.loads(text).get("task", {})
        return {"type": str(task.get("type", "")), "index": int(task.get("index", 0))}
    except (ValueError, AttributeError, TypeError):
        return None
