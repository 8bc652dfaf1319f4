"""NaN autopsy: on the first non-finite step, what was its first cause?

Two ways to answer, depending on what is at hand when the step is seen:

- :func:`replay` re-runs the offending batch eagerly, layer by layer, and names the first
  cause (one of :data:`CAUSES`): the batch or its labels, the first layer whose output is
  NaN/Inf from finite inputs (with what its input was), weights poisoned before the step, the
  loss function, or the backward pass. ``fit``'s step keeps its batch and the weights of
  before its update on that step only (:mod:`trainvitals.agent.bad_step`), and the replay runs
  on a copy of the model holding them; custom loops hand the batch to
  :class:`~trainvitals.Monitor`, which replays it.
- :func:`from_vitals` works from what the step measured (the counts by origin, each
  variable's gradient norm on that step and on the last healthy sample) plus a look at the
  weights, where no batch could be kept (a GPU, XLA, several replicas, ragged data).

Both return a JSON-ready :class:`Report` with a one-line ``verdict``; :func:`of_step` picks
one and never raises (what the callback and ``Monitor`` call). Imports TensorFlow: load lazily.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import numpy as np
import tensorflow as tf

from trainvitals.agent.bad_step import Kept
from trainvitals.series import GRAD_NORM_PREFIX

#: Layers listed in a replay report, at most (the first bad one is always among them).
MAX_LAYERS = 40

#: One layer's output in a replay: its name and class, NaN/Inf elements, largest finite |x|.
LayerRow = TypedDict("LayerRow", {"layer": str, "class": str, "nonfinite": int, "max_abs": float})


class Rise(TypedDict):
    """A variable whose gradient norm rose ``ratio`` times since the last healthy sample."""

    variable: str
    ratio: float


class Report(TypedDict, total=False):
    """An autopsy, as sent in the ``autopsy`` frame. ``method`` says which keys it has:
    ``"replay"`` (:func:`replay`) or ``"vitals"`` (:func:`from_vitals`); ``error`` alone when
    the autopsy itself failed; ``action`` when a :class:`~trainvitals.Protection` acted."""

    method: Literal["replay", "vitals"]
    #: Where the NaN/Inf came from: inputs, weights, layer, loss, backward, gradients.
    origin: str
    #: The first cause, one of :data:`CAUSES`: what the alert says and what its remedy is.
    cause: str
    verdict: str
    #: The bad samples of the batch and the bad features (last axis) among them.
    samples: list[int]
    features: list[int]
    #: For a layer's NaN/Inf: what its input was (negative, zero, overflow, nonfinite_only).
    domain: str
    # replay
    inputs_nonfinite: int
    targets_nonfinite: int
    layer_by_layer: bool
    layers: list[LayerRow]
    layer: str
    # both: {layer name: NaN/Inf elements in its weights}
    weights_nonfinite: dict[str, int]
    # vitals
    counts: dict[str, float]
    gradients_nonfinite: list[str]
    largest_rises: list[Rise]
    action: str
    error: str


#: The first causes an autopsy can name; each has its own message and remedy (the server's
#: ``detect/text.py``). "gradients": only the vitals were at hand, which cannot tell a layer's
#: hidden NaN from a backward overflow.
CAUSES = (
    "inputs", "labels", "layer", "loss", "backward", "poisoned_weights", "lr_blowup",
    "gradients",
)  # fmt: skip


def _count(structure: Any) -> int:
    total = 0
    for tensor in tf.nest.flatten(structure):
        if tensor is None:
            continue
        array = np.asarray(tensor)
        if array.dtype.kind == "f":
            total += int(array.size - np.count_nonzero(np.isfinite(array)))
    return total


def _max_abs(structure: Any) -> float:
    top = 0.0
    for tensor in tf.nest.flatten(structure):
        array = np.asarray(tensor)
        if array.dtype.kind == "f" and array.size:
            finite = array[np.isfinite(array)]
            if finite.size:
                top = max(top, float(np.max(np.abs(finite))))
    return top


def poisoned_weights(model: Any) -> dict[str, int]:
    """``{layer name: NaN/Inf elements in its weights}`` for every layer that has any."""
    out = {}
    for layer in getattr(model, "layers", []):
        bad = _count([w.value for w in layer.weights])
        if bad:
            out[layer.name] = bad
    return out


def of_step(
    model: Any,
    values: Mapping[str, float],
    previous_norms: Mapping[str, float],
    inputs: Any = None,
    targets: Any = None,
    kept: Kept | None = None,
    poisoned_at_start: bool = False,
    after_update: bool = False,
) -> Report:
    """The autopsy of a step with a NaN/Inf, never raising: a :func:`replay` of its batch when
    the model and the batch are at hand (``kept``: the batch and the weights of before the
    update, from ``fit``'s step), else :func:`from_vitals`. ``after_update``: the model's
    weights may hold that step's update (a custom loop), so weights a replay finds poisoned
    are no cause of their own."""
    try:
        if model is not None and kept is not None:
            x, y, _ = _unpacked(kept.data)
            replica = _with_weights(model, kept.weights, x)
            if replica is not None:
                report = replay(replica, x, y, loss_of=model)
                return _refined(report, poisoned_at_start)
        if model is not None and inputs is not None:
            report = replay(model, inputs, targets)
            if not (after_update and report.get("cause") == "poisoned_weights"):
                return report
        return from_vitals(model, values, previous_norms)
    except Exception as exc:  # an autopsy must never break training
        return {"error": f"{type(exc).__name__}: {exc}"}


def _unpacked(data: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` from what ``train_step`` received, as Keras unpacks it."""
    if isinstance(data, (list, tuple)) and 1 <= len(data) <= 3:
        items = list(data) + [None] * (3 - len(data))
        return items[0], items[1], items[2]
    return data, None, None


def _with_weights(model: Any, weights: list[np.ndarray], inputs: Any) -> Any:
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


def _refined(report: Report, poisoned_at_start: bool) -> Report:
    """Weights NaN/Inf before the bad step: poisoned as fit began (a restored checkpoint, an
    earlier fit), or by an update of finite gradients (every step before was finite, or its
    batch would have been kept): a learning-rate blow-up."""
    if report.get("cause") != "poisoned_weights" or poisoned_at_start:
        return report
    layers = sorted(report.get("weights_nonfinite", {}))
    report["cause"] = "lr_blowup"
    report["verdict"] = (
        f"The weights of {_listed(layers)} became NaN/Inf through an update of finite "
        "gradients: the steps grew without bound (the learning rate is too high for them)"
    )
    return report


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "") or "the model"


def replay(model: Any, inputs: Any, targets: Any = None, loss_of: Any = None) -> Report:
    """Re-run one batch through ``model`` layer by layer (inference mode, no side effects)
    and name the first cause of its NaN/Inf: the batch, the labels, the first layer whose
    output is not finite from finite inputs (with or without variables, and what its input
    was), weights already poisoned, the loss, or the backward pass. ``loss_of``: the model
    whose compiled loss to use (default ``model``).

    Example:
        ```python
        report = trainvitals.agent.autopsy.replay(model, x_batch, y_batch)
        print(report["verdict"])   # "Layer 'log' (Lambda) turned finite inputs into 3 NaN..."
        ```
    """
    report: Report = {
        "method": "replay",
        "inputs_nonfinite": _count(inputs),
        "targets_nonfinite": _count(targets),
        "weights_nonfinite": poisoned_weights(model),
    }
    if report["inputs_nonfinite"] or report["targets_nonfinite"]:
        bad_inputs = report["inputs_nonfinite"] > 0
        samples, features = _where_bad(inputs if bad_inputs else targets)
        report["origin"] = "inputs"
        report["cause"] = "inputs" if bad_inputs else "labels"
        report["samples"], report["features"] = samples, features
        where = f"samples {_few(samples)}" + (f", features {_few(features)}" if features else "")
        report["verdict"] = (
            f"The batch was already bad: {report['inputs_nonfinite']} NaN/Inf in the inputs, "
            f"{report['targets_nonfinite']} in the targets ({where})"
        )
        return report
    layers = _layer_outputs(model, inputs)
    if layers is None:  # a subclassed model: only its output can be checked
        outputs = model(inputs, training=False)
        layers = [(model.name, type(model).__name__, outputs)]
        report["layer_by_layer"] = False
    rows: list[LayerRow] = []
    first: LayerRow | None = None
    first_at = 0
    for index, (name, kind, output) in enumerate(layers):
        row: LayerRow = {
            "layer": name,
            "class": kind,
            "nonfinite": _count(output),
            "max_abs": _max_abs(output),
        }
        rows.append(row)
        if first is None and row["nonfinite"]:
            first, first_at = row, index
    report["layers"] = rows[:MAX_LAYERS]
    poisoned = report["weights_nonfinite"]
    if first is not None and not poisoned.get(first["layer"]):
        report["origin"] = report["cause"] = "layer"
        report["layer"] = first["layer"]
        seen = _layer_input(model, inputs, first["layer"], layers, first_at)
        domain, said = _domain(seen, layers[first_at][2])
        report["domain"] = domain
        report["verdict"] = (
            f"Layer {first['layer']!r} ({first['class']}) turned finite inputs into "
            f"{first['nonfinite']} NaN/Inf values: {said}"
        )
        return report
    if poisoned:
        if first is not None:
            report["layer"] = first["layer"]
        report["origin"] = "weights"
        report["cause"] = "poisoned_weights"
        report["verdict"] = (
            f"The weights of {_listed(sorted(poisoned))} were NaN/Inf before this step "
            f"({sum(poisoned.values())} values): the batch is not to blame"
        )
        return report
    labels = _labels_out_of_range(loss_of or model, targets, layers[-1][2])
    if labels is not None:
        report["origin"], report["cause"], report["verdict"] = "inputs", "labels", labels
        return report
    loss = _loss(loss_of or model, targets, layers[-1][2])
    if loss is not None and not math.isfinite(loss):
        report["origin"] = report["cause"] = "loss"
        report["verdict"] = (
            "Every layer's output is finite, but the loss is not: the loss function took a "
            "log of zero, divided by zero or overflowed"
        )
        return report
    report["origin"] = report["cause"] = "backward"
    bad = _backward(model, loss_of or model, inputs, targets)
    report["verdict"] = (
        "The forward pass and the loss replay finite, but the gradients are not"
        + (f" (first: {bad[0]})" if bad else "")
        + ": an operation whose derivative is infinite where it was taken (a square root or "
        "a power below 1 at zero), or an overflow in the backward pass"
    )
    if bad:
        report["gradients_nonfinite"] = bad[:20]
    return report


def _few(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices[:5]) + (" ..." if len(indices) > 5 else "")


def _where_bad(structure: Any) -> tuple[list[int], list[int]]:
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


def _layer_input(
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


def _domain(seen: Any, output: Any) -> tuple[str, str]:
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


def _backward(model: Any, loss_of: Any, inputs: Any, targets: Any) -> list[str]:
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


def _labels_out_of_range(model: Any, targets: Any, predictions: Any) -> str | None:
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


def from_vitals(
    model: Any,
    values: Mapping[str, float],
    previous_norms: Mapping[str, float],
) -> Report:
    """An autopsy from one compiled step's vitals: ``values`` are the step's series (with its
    per-variable norms), ``previous_norms`` the per-variable norms last seen healthy."""
    counts = {
        origin: values[f"nonfinite/{origin}"]
        for origin in ("inputs", "loss", "grads")
        if values.get(f"nonfinite/{origin}")
    }
    report: Report = {
        "method": "vitals",
        "counts": counts,
        "weights_nonfinite": poisoned_weights(model),
    }
    norms = {
        name.removeprefix(GRAD_NORM_PREFIX): value
        for name, value in values.items()
        if name.startswith(GRAD_NORM_PREFIX)
    }
    overflowed = [name for name, value in norms.items() if not math.isfinite(value)]
    if overflowed:
        report["gradients_nonfinite"] = overflowed[:20]
    rises = sorted(
        (
            (value / previous_norms[name], name)
            for name, value in norms.items()
            if math.isfinite(value) and previous_norms.get(name, 0) > 0
        ),
        reverse=True,
    )
    if rises:
        report["largest_rises"] = [{"variable": n, "ratio": r} for r, n in rises[:5]]
    if counts.get("inputs"):
        report["origin"] = report["cause"] = "inputs"
        report["verdict"] = f"The batch was already bad: {counts['inputs']:.0f} NaN/Inf in it"
    elif counts.get("loss"):
        report["origin"] = report["cause"] = "loss"
        report["verdict"] = (
            "A clean batch gave a NaN/Inf loss: a layer, the loss function or an overflow "
            "(the batch could not be replayed to tell which)"
        )
    else:
        report["origin"] = report["cause"] = "gradients"
        which = (
            f"the gradients of {overflowed[0]} (and {len(overflowed) - 1} more)"
            if overflowed and len(overflowed) < len(norms)
            else "every gradient"
        )
        report["verdict"] = (
            f"The loss is finite but {which} are NaN/Inf: a layer's NaN that a later "
            "operation hid from the loss, or an overflow in the backward pass (the batch "
            "could not be replayed to tell which)"
        )
    if report["weights_nonfinite"] and not counts:
        report["origin"], report["cause"] = "weights", "poisoned_weights"
        report["verdict"] = (
            f"The weights of {_listed(sorted(report['weights_nonfinite']))} are NaN/Inf "
            "while the loss is finite: the model is silently poisoned"
        )
    if rises and rises[0][0] >= 10:
        report["verdict"] += f"; {rises[0][1]}'s gradient had risen {rises[0][0]:.0f}x"
    return report


def _layer_outputs(model: Any, inputs: Any) -> list[tuple[str, str, Any]] | None:
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


def _loss(model: Any, targets: Any, predictions: Any) -> float | None:
    loss = _loss_function(model)
    if targets is None or loss is None:
        return None
    try:
        return float(tf.reduce_mean(loss(targets, predictions)))
    except Exception:
        return None
