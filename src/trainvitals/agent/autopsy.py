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

from trainvitals.agent.bad_step import Kept
from trainvitals.agent.model_probe import (
    backward_nonfinite,
    count_nonfinite,
    input_domain,
    labels_out_of_range,
    layer_input,
    layer_outputs,
    loss_of_batch,
    max_abs,
    unpacked,
    where_bad,
    with_weights,
)
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


def poisoned_weights(model: Any) -> dict[str, int]:
    """``{layer name: NaN/Inf elements in its weights}`` for every layer that has any."""
    out = {}
    for layer in getattr(model, "layers", []):
        bad = count_nonfinite([w.value for w in layer.weights])
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
            x, y, _ = unpacked(kept.data)
            replica = with_weights(model, kept.weights, x)
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
        "inputs_nonfinite": count_nonfinite(inputs),
        "targets_nonfinite": count_nonfinite(targets),
        "weights_nonfinite": poisoned_weights(model),
    }
    if report["inputs_nonfinite"] or report["targets_nonfinite"]:
        bad_inputs = report["inputs_nonfinite"] > 0
        samples, features = where_bad(inputs if bad_inputs else targets)
        report["origin"] = "inputs"
        report["cause"] = "inputs" if bad_inputs else "labels"
        report["samples"], report["features"] = samples, features
        where = f"samples {_few(samples)}" + (f", features {_few(features)}" if features else "")
        report["verdict"] = (
            f"The batch was already bad: {report['inputs_nonfinite']} NaN/Inf in the inputs, "
            f"{report['targets_nonfinite']} in the targets ({where})"
        )
        return report
    layers = layer_outputs(model, inputs)
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
            "nonfinite": count_nonfinite(output),
            "max_abs": max_abs(output),
        }
        rows.append(row)
        if first is None and row["nonfinite"]:
            first, first_at = row, index
    report["layers"] = rows[:MAX_LAYERS]
    poisoned = report["weights_nonfinite"]
    if first is not None and not poisoned.get(first["layer"]):
        report["origin"] = report["cause"] = "layer"
        report["layer"] = first["layer"]
        seen = layer_input(model, inputs, first["layer"], layers, first_at)
        domain, said = input_domain(seen, layers[first_at][2])
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
    labels = labels_out_of_range(loss_of or model, targets, layers[-1][2])
    if labels is not None:
        report["origin"], report["cause"], report["verdict"] = "inputs", "labels", labels
        return report
    loss = loss_of_batch(loss_of or model, targets, layers[-1][2])
    if loss is not None and not math.isfinite(loss):
        report["origin"] = report["cause"] = "loss"
        report["verdict"] = (
            "Every layer's output is finite, but the loss is not: the loss function took a "
            "log of zero, divided by zero or overflowed"
        )
        return report
    report["origin"] = report["cause"] = "backward"
    bad = backward_nonfinite(model, loss_of or model, inputs, targets)
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
