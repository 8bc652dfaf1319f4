"""Training vitals as TensorFlow ops: NaN/Inf counts and gradient norms.

Used inside the compiled train step by :class:`~trainvitals.VitalsCallback` (so the values
reach the host with the logs Keras fetches anyway) and eagerly by
:class:`~trainvitals.Monitor` in custom loops. Imports TensorFlow: load it lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def _dense(tensor: Any) -> Any:
    if isinstance(tensor, tf.IndexedSlices):  # embedding gradients
        return tensor.values
    return tf.convert_to_tensor(tensor)


def nonfinite_count(structure: Any) -> tf.Tensor:
    """NaN/Inf elements across every floating tensor in a (nested) structure, as int64."""
    total = tf.constant(0, tf.int64)
    for tensor in tf.nest.flatten(structure):
        if tensor is None:
            continue
        dense = _dense(tensor)
        if not dense.dtype.is_floating:
            continue
        total += tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(dense)), tf.int64))
    return total


def gradient_vitals(grads: Sequence[Any], loss_scale: Any = None) -> dict[str, tf.Tensor]:
    """Global norm, per-variable norms (a vector, in the order of ``grads``) and NaN/Inf count.

    ``loss_scale``: the mixed-precision loss scale the gradients carry, divided out so the
    norms are those of the true gradients.
    """
    squares = []
    for grad in grads:
        if grad is None:
            squares.append(tf.constant(0.0, tf.float32))
            continue
        squares.append(tf.reduce_sum(tf.square(tf.cast(_dense(grad), tf.float32))))
    stacked = tf.stack(squares) if squares else tf.zeros([0], tf.float32)
    if loss_scale is not None:
        stacked = stacked / tf.square(tf.cast(loss_scale, tf.float32))
    return {
        "global_norm": tf.sqrt(tf.reduce_sum(stacked)),
        "norms": tf.sqrt(stacked),
        "nonfinite": nonfinite_count([g for g in grads if g is not None]),
    }


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
    if model is not None:
        strategy = getattr(model, "distribute_strategy", None)
        if strategy is not None:
            env["distribution_strategy"] = type(strategy).__name__
            env["replicas"] = int(getattr(strategy, "num_replicas_in_sync", 1))
        env["jit_compile"] = bool(getattr(model, "jit_compile", False))
    return env
