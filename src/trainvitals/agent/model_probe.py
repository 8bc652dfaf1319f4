"""Looks inside a Keras model on one batch, for the NaN autopsy (:mod:`trainvitals.agent.autopsy`).

Counting NaN/Inf in nested tensors, each layer's output and a layer's input, the loss and the
gradients of a replayed batch, and a copy of the model holding other weights. Each look that
Keras cannot take on a model (a subclassed one, a loss that cannot be called again) answers
None or nothing rather than raising. Imports TensorFlow: load lazily.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf


def count_nonfinite(structure: Any) -> int:
    """NaN/Inf elements in the floating tensors of a nested structure."""
    total = 0
    for tensor in tf.nest.flatten(structure):
        if tensor is None:
            continue
        array = np.asarray(tensor)
        if array.dtype.kind == "f":
            total += int(array.size - np.count_nonzero(np.isfinite(array)))
    return total


def max_abs(structure: Any) -> float:
    """The largest finite |x| in the floating tensors of a nested structure (0 if none)."""
    top = 0.0
    for tensor in tf.nest.flatten(structure):
        array = np.asarray(tensor)
        if array.dtype.kind == "f" and array.size:
            finite = array[np.isfinite(array)]
            if finite.size:
                top = max(top, float(np.max(np.abs(finite))))
    return top


def unpacked(data: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` from what ``train_step`` received, as Keras unpacks it."""
    if isinstance(data, (list, tuple)) and 1 <= len(data) <= 3:
        items = list(data) + [None] * (3 - len(data))
        return items[0], items[1], items[2]
    return data, None, None


def with_weights(model: Any, weights: list[np.ndarray], inputs: Any) -> Any:
    """A copy of ``model`` holding ``weights`` (the live model trains on, on another
    thread), or None where Keras cannot clone it (a subclassed model)."""
    import keras

    def clone(layer: Any) -> Any:
        # A layer without variables holds nothing to copy, and is shared as it is: a Lambda
        # rebuilt from its config loses its function's globals.
        return layer if not layer.weights else layer.__class__.from_config(layer.get_config())

    try:
        replica = keras.models.clone_model(model, clone_function=clone)
        if len(replica.weights) != len(weights):  # a clone is built at its first call
            replica(inputs, training=False)
        replica.set_weights(weights)
    except Exception:
        return None
    return replica


def where_bad(structure: Any) -> tuple[list[int], list[int]]:
    """The samples (first axis) holding NaN/Inf, and the features (last axis) that do."""
    samples: set[int] = set()
    features: set[int] = set()
    for tensor in tf.nest.flatten(structure):
        if tensor is None:
            continue
        array = np.asarray(tensor)
        if array.dtype.kind != "f" or array.ndim == 0:
            continue
        bad = ~np.isfinite(array)
        samples.update(int(i) for i in np.flatnonzero(bad.reshape(len(array), -1).any(axis=1)))
        if array.ndim >= 2:
            features.update(int(i) for i in np.flatnonzero(bad.reshape(-1, array.shape[-1]).any(0)))
    return sorted(samples)[:20], sorted(features)[:20]


def layer_input(
    model: Any, inputs: Any, name: str, layers: list[tuple[str, str, Any]], at: int
) -> Any:
    """What layer ``name`` received: from the model's graph where it can be read, else the
    previous layer's output (a Sequential), else the batch."""
    try:
        import keras

        layer = model.get_layer(name)
        probe = keras.Model(model.inputs, layer.input)
        return probe(inputs, training=False)
    except Exception:
        return layers[at - 1][2] if at > 0 else inputs


def input_domain(seen: Any, output: Any) -> tuple[str, str]:
    """What a layer's finite input says of its NaN/Inf output: ``(kind, words)``."""
    arrays = [np.asarray(t) for t in tf.nest.flatten(seen) if t is not None]
    values = [a.ravel() for a in arrays if a.dtype.kind == "f" and a.size]
    out = [np.asarray(t) for t in tf.nest.flatten(output) if t is not None]
    made_nan = any(bool(np.isnan(a).any()) for a in out if a.dtype.kind == "f")
    made_inf = any(bool(np.isinf(a).any()) for a in out if a.dtype.kind == "f")
    if not values:
        return "nonfinite_only", "an operation of the layer itself"
    flat = np.concatenate(values)
    low, top = float(np.min(flat)), float(np.max(np.abs(flat)))
    if made_nan and low < 0:
        return "negative", (
            f"its input holds negative values (min {low:.3g}): the log or square root of a "
            "negative number"
        )
    if made_inf and bool(np.any(flat == 0)):
        return "zero", "its input holds zeros: the log of zero, or a division by zero"
    if made_inf:
        return "overflow", f"an overflow to Inf (largest input |x| {top:.3g})"
    if bool(np.any(flat == 0)):
        return "zero", "its input holds zeros: 0/0 or 0 times Inf"
    return "nonfinite_only", f"an operation of the layer itself (inputs up to |x| {top:.3g})"


def backward_nonfinite(model: Any, loss_of: Any, inputs: Any, targets: Any) -> list[str]:
    """The variables whose gradient is not finite on a replay of the batch (training mode
    off), or [] where the loss cannot be taken again."""
    loss_fn = _loss_function(loss_of)
    if loss_fn is None or targets is None:
        return []
    try:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(targets, model(inputs, training=False)))
        grads = tape.gradient(loss, model.trainable_variables)
    except Exception:
        return []
    return [
        v.path
        for v, g in zip(model.trainable_variables, grads, strict=True)
        if g is not None and not bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g))))
    ]


def labels_out_of_range(model: Any, targets: Any, predictions: Any) -> str | None:
    """For a sparse categorical loss: integer labels outside ``[0, classes)``."""
    loss = getattr(model, "loss", None)
    name = loss if isinstance(loss, str) else getattr(loss, "name", type(loss).__name__)
    if targets is None or not isinstance(name, str) or "sparse" not in name.lower():
        return None
    labels = np.asarray(targets)
    classes = int(np.asarray(predictions).shape[-1])
    outside = (labels < 0) | (labels >= classes)
    if not outside.any():
        return None
    return (
        f"{int(outside.sum())} labels lie outside the {classes} classes the model predicts "
        f"(found {sorted({int(v) for v in labels[outside]})[:5]}): a sparse loss takes a "
        "label in [0, classes)"
    )


def layer_outputs(model: Any, inputs: Any) -> list[tuple[str, str, Any]] | None:
    """Each layer's ``(name, class, output)`` on ``inputs``, in order; None where the model's
    layers cannot be called one by one (a subclassed model)."""
    layers = [
        layer for layer in getattr(model, "layers", []) if type(layer).__name__ != "InputLayer"
    ]
    if not layers:
        return None
    try:
        import keras

        inputs_spec = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        probe = keras.Model(inputs_spec, [layer.output for layer in layers])
        outputs = probe(inputs, training=False)
    except Exception:
        if type(model).__name__ != "Sequential":
            return None
        outputs, x = [], inputs  # a Sequential built without an Input: call layer by layer
        for layer in layers:
            x = layer(x, training=False)
            outputs.append(x)
    if len(layers) == 1 and not isinstance(outputs, list | tuple):
        outputs = [outputs]
    return [
        (layer.name, type(layer).__name__, output)
        for layer, output in zip(layers, outputs, strict=True)
    ]


def _loss_function(model: Any) -> Any:
    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        import keras

        try:
            return keras.losses.get(loss)
        except Exception:
            return None
    return loss if callable(loss) else None


def loss_of_batch(model: Any, targets: Any, predictions: Any) -> float | None:
    """The model's compiled loss on ``predictions``, or None where it cannot be taken again."""
    loss = _loss_function(model)
    if targets is None or loss is None:
        return None
    try:
        return float(tf.reduce_mean(loss(targets, predictions)))
    except Exception:
        return None
