"""NaN autopsy: on the first non-finite step, where did the NaN/Inf come from?

Two ways to answer, depending on what is at hand when the step is seen:

- :func:`replay` re-runs the offending batch eagerly, layer by layer, and reports whether
  the batch was already bad or which layer first produced a NaN/Inf from finite inputs.
  Custom loops hand the batch to :class:`~trainvitals.Monitor`, which replays it.
- :func:`from_vitals` works from what the compiled ``fit`` step already measured (the counts
  by origin, each variable's gradient norm on that step and on the last healthy sample) plus
  a look at the weights: which variables' gradients overflowed, which rose most, which layers'
  weights are poisoned. ``fit`` consumes its batches inside the compiled function, so the
  batch itself is gone by the time the host sees the step.

Both return a JSON-ready :class:`Report` with a one-line ``verdict``; :func:`of_step` picks
one and never raises (what the callback and ``Monitor`` call). Imports TensorFlow: load lazily.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import numpy as np
import tensorflow as tf

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
    verdict: str
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
) -> Report:
    """The autopsy of a step with a NaN/Inf, never raising: a :func:`replay` of its batch when
    the model and the batch are at hand, else :func:`from_vitals`."""
    try:
        if model is not None and inputs is not None:
            return replay(model, inputs, targets)
        return from_vitals(model, values, previous_norms)
    except Exception as exc:  # an autopsy must never break training
        return {"error": f"{type(exc).__name__}: {exc}"}


def replay(model: Any, inputs: Any, targets: Any = None) -> Report:
    """Re-run one batch through ``model`` layer by layer (inference mode, no side effects).

    Example:
        ```python
        report = trainvitals.agent.autopsy.replay(model, x_batch, y_batch)
        print(report["verdict"])   # "Layer 'exp' turned finite inputs (max |x| 812) into NaN/Inf"
        ```
    """
    report: Report = {
        "method": "replay",
        "inputs_nonfinite": _count(inputs),
        "targets_nonfinite": _count(targets),
        "weights_nonfinite": poisoned_weights(model),
    }
    if report["inputs_nonfinite"] or report["targets_nonfinite"]:
        report["origin"] = "inputs"
        report["verdict"] = (
            f"The batch was already bad: {report['inputs_nonfinite']} NaN/Inf in the inputs, "
            f"{report['targets_nonfinite']} in the targets"
        )
        return report
    layers = _layer_outputs(model, inputs)
    if layers is None:  # a subclassed model: only its output can be checked
        outputs = model(inputs, training=False)
        layers = [(model.name, type(model).__name__, outputs)]
        report["layer_by_layer"] = False
    rows: list[LayerRow] = []
    first: LayerRow | None = None
    first_input_max = previous_max = _max_abs(inputs)
    for name, kind, output in layers:
        row: LayerRow = {
            "layer": name,
            "class": kind,
            "nonfinite": _count(output),
            "max_abs": _max_abs(output),
        }
        rows.append(row)
        if first is None and row["nonfinite"]:
            first, first_input_max = row, previous_max
        previous_max = row["max_abs"]
    report["layers"] = rows[:MAX_LAYERS]
    if first is not None:
        report["layer"] = first["layer"]
        poisoned = report["weights_nonfinite"].get(first["layer"])
        if poisoned:
            report["origin"] = "weights"
            report["verdict"] = (
                f"Layer {first['layer']!r} holds {poisoned} NaN/Inf weights: the first bad "
                "output comes from poisoned weights, not from this batch"
            )
        else:
            report["origin"] = "layer"
            report["verdict"] = (
                f"Layer {first['layer']!r} ({first['class']}) turned finite inputs (max |x| "
                f"{first_input_max:.3g}) into {first['nonfinite']} NaN/Inf values"
            )
        return report
    loss = _loss(model, targets, layers[-1][2])
    if loss is not None and not math.isfinite(loss):
        report["origin"] = "loss"
        report["verdict"] = (
            "Every layer's output is finite, but the loss is not: look for a log or division "
            "of zero, or labels outside the loss's range"
        )
    else:
        report["origin"] = "backward"
        report["verdict"] = (
            "The forward pass and the loss replay finite: the NaN/Inf came from the gradients "
            "or the update (an overflow in the backward pass or the optimizer)"
        )
    return report


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
        report["origin"] = "inputs"
        report["verdict"] = f"The batch was already bad: {counts['inputs']:.0f} NaN/Inf in it"
    elif counts.get("loss"):
        report["origin"] = "loss"
        report["verdict"] = (
            "A clean batch gave a NaN/Inf loss: the forward pass or the loss overflowed"
        )
    elif overflowed and len(overflowed) < len(norms):
        report["origin"] = "gradients"
        report["verdict"] = (
            f"The loss is finite but the gradients of {overflowed[0]} (and "
            f"{len(overflowed) - 1} more) overflowed"
        )
    else:
        report["origin"] = "gradients"
        report["verdict"] = "The loss is finite but every gradient overflowed"
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


def _loss(model: Any, targets: Any, predictions: Any) -> float | None:
    loss = getattr(model, "loss", None)
    if targets is None or loss is None:
        return None
    try:
        if isinstance(loss, str):
            import keras

            loss = keras.losses.get(loss)
        return float(tf.reduce_mean(loss(targets, predictions)))
    except Exception:
        return None
