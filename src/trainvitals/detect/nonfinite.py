"""The ``nonfinite`` rule: NaN/Inf anywhere, named by where it came from first."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainvitals.detect import settings as s
from trainvitals.detect.base import Context, Rule, finite
from trainvitals.detect.evidence import NonfiniteEvidence
from trainvitals.detect.text import listing
from trainvitals.detect.types import Finding, Record
from trainvitals.protocol import UNSAFE_CHARS, ArrayColumns
from trainvitals.series import (
    GRAD_GLOBAL_NORM,
    GRAD_NORM_PREFIX,
    LOSS,
    LOSS_SCALE,
    NONFINITE_PREFIX,
    NONFINITE_WEIGHTS,
)

#: Where NaN/Inf can first appear, in the order that explains the rest: bad data poisons the
#: loss, poisoned weights poison everything, a loss overflow poisons the gradients.
ORIGINS = ("inputs", "weights", "loss", "grads")
_PLACE = {"inputs": "input batch", "weights": "weights", "loss": "loss", "grads": "gradients"}

NONFINITE_HINTS = {
    "inputs": (
        "The data itself carries NaN/Inf: find the bad records (check the preprocessing for "
        "division by zero, log of zero, missing values) and filter them, e.g. "
        "`dataset.filter(lambda x, y: tf.reduce_all(tf.math.is_finite(x)))`. One bad batch "
        "has already poisoned the weights through its gradients: resume from the last "
        "checkpoint once the data is clean."
    ),
    "weights": (
        "The weights hold NaN/Inf, so every later step is lost: resume from the last good "
        "checkpoint, and lower the learning rate or clip gradients (`clipnorm=1.0`)."
    ),
    "loss": (
        "The forward pass overflowed on a clean batch: lower the learning rate, clip "
        "gradients (`clipnorm=1.0`), add an epsilon to log/divide/sqrt in a custom loss, and "
        "under mixed precision compute the loss in float32."
    ),
    "grads": (
        "The backward pass overflowed while the loss was finite: clip gradients "
        "(`clipnorm=1.0`) and lower the learning rate; under float16 use Keras's "
        "LossScaleOptimizer (the mixed_float16 policy does)."
    ),
}


#: The remedy of each first cause an agent's autopsy names (``agent/autopsy.py``'s CAUSES):
#: never one that belongs to another cause.
CAUSE_HINTS = {
    "inputs": NONFINITE_HINTS["inputs"],
    "labels": (
        "The labels are bad: NaN/Inf targets, or integer labels outside [0, classes) for a "
        "sparse loss (check the label encoding and the model's output size). Fix the data, "
        "then resume from the last checkpoint: the bad batch's gradients reached the weights."
    ),
    "layer": (
        "A layer made NaN/Inf from finite inputs: guard its operation (an epsilon or a clip "
        "before log, sqrt or a division, e.g. `tf.math.log(tf.maximum(x, 1e-7))`; "
        "`tf.clip_by_value` before exp), or fix the data that reaches it. Clipping gradients "
        "or lowering the learning rate does not help here. Resume from the last checkpoint."
    ),
    "loss": (
        "The loss function made NaN/Inf from finite predictions: add an epsilon to log and "
        "divisions in a custom loss (`keras.ops.log(y + 1e-7)`), use `from_logits=True` "
        "rather than a softmax followed by a log, and under mixed precision compute the loss "
        "in float32."
    ),
    "backward": (
        "Only the backward pass is not finite: an operation whose derivative is infinite "
        "where it was taken (sqrt or a power below 1 at 0: add an epsilon inside), or a "
        "float16 overflow (use mixed precision's LossScaleOptimizer, keep that layer in "
        "float32). Resume from the last checkpoint."
    ),
    "poisoned_weights": (
        "The weights were NaN/Inf before this step, so every later step is lost: resume from "
        "the last checkpoint whose weights are finite (check with "
        "`all(np.isfinite(w).all() for w in model.get_weights())` after loading)."
    ),
    "lr_blowup": (
        "The updates grew without bound on finite gradients: lower the learning rate or add "
        "a warm-up, clip the update (`clipnorm=1.0`), and resume from the last checkpoint."
    ),
    "gradients": (
        "The loss is finite but the gradients are not: a layer may make NaN that a later "
        "operation hides (relu(NaN) is 0 on oneDNN), or the backward pass overflows. Run one "
        "epoch with `run_eagerly=True` to get a replay of the bad batch, or check custom "
        "layers for log, sqrt and divisions without an epsilon."
    ),
}


_UNSAFE = re.compile(f"[{UNSAFE_CHARS}]")


def cause_said(autopsy: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``nonfinite`` alert's message and hint from the autopsy's first cause, or None
    when the autopsy names none this server knows."""
    cause, verdict = autopsy.get("cause"), autopsy.get("verdict")
    if not isinstance(cause, str) or cause not in CAUSE_HINTS or not isinstance(verdict, str):
        return None
    step = autopsy.get("step")
    at = f"NaN/Inf at step {step}: " if isinstance(step, int) else ""
    # The verdict comes from the agent: into log lines and channels it goes on one line.
    said = " ".join(_UNSAFE.sub(" ", verdict).split())[:400]
    return at + said, CAUSE_HINTS[cause]


def loss_scale_skip(scale: float | None) -> bool:
    """Whether gradients that overflow under this loss scale make a step the
    ``LossScaleOptimizer`` skips while it lowers the scale (normal under float16), rather
    than gradients that overflow by themselves: a scale above 1 still magnifies them."""
    return scale is not None and math.isfinite(scale) and scale > 1


class NonfiniteRule(Rule):
    """NaN/Inf anywhere, critical in the very step it appears, naming where it came from."""

    id = "nonfinite"
    watches = (LOSS, GRAD_GLOBAL_NORM, NONFINITE_PREFIX, GRAD_NORM_PREFIX, LOSS_SCALE)

    def __init__(self, context: Context, settings: s.Nonfinite) -> None:
        super().__init__(context)
        self.settings = settings
        self._clean = 0
        self._skips = 0
        self._seen: set[str] = set()
        self._bad_steps = 0
        self._last_loss: float | None = None
        self._last_norm: float | None = None

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        relevant = {
            name: column
            for name, column in dense.items()
            if name.startswith(NONFINITE_PREFIX) or name in (LOSS, GRAD_GLOBAL_NORM)
        }
        if not relevant:
            return []
        for name, (_, _, values) in relevant.items():
            clean = not np.any(values != 0) if name.startswith(NONFINITE_PREFIX) else None
            if clean is None:
                clean = bool(np.all(np.isfinite(values)))
            if not clean:
                return None  # judged step by step, to name the very step and the origin
        steps, times, _ = max(relevant.values(), key=lambda column: len(column[0]))
        before, self._clean, self._skips = self._clean, self._clean + len(steps), 0
        if LOSS in relevant:
            self._last_loss = float(relevant[LOSS][2][-1])
        if GRAD_GLOBAL_NORM in relevant:
            self._last_norm = float(relevant[GRAD_GLOBAL_NORM][2][-1])
        if self.firing and self._clean >= self.settings.clear_steps:
            at = max(0, self.settings.clear_steps - before - 1)
            self._seen.clear()
            return [self.resolve("", Record(int(steps[at]), float(times[at]), {}))]
        return []

    def observe(self, record: Record) -> list[Finding]:
        values = record.values
        counts: dict[str, float] = {}
        for origin in ORIGINS:
            count = values.get(f"nonfinite/{origin}")
            if count is not None and not (count == 0):
                counts[origin] = count
        loss, norm = values.get(LOSS), values.get(GRAD_GLOBAL_NORM)
        where = set(counts)
        if loss is not None and not math.isfinite(loss):
            where.add("loss")
        if norm is not None and not math.isfinite(norm):
            where.add("grads")
        if not where:
            if counts or loss is not None or norm is not None or NONFINITE_WEIGHTS in values:
                self._clean += 1
                self._skips = 0
                if finite(loss):
                    self._last_loss = loss
                if finite(norm):
                    self._last_norm = norm
                if self.firing and self._clean >= self.settings.clear_steps:
                    self._seen.clear()
                    return [self.resolve("", record)]
            return []
        self._clean = 0
        scale = values.get(LOSS_SCALE)
        if where == {"grads"} and scale is not None:
            # The agent says under which loss scale: above 1, the optimizer skips the step and
            # lowers the scale (nothing is lost); at 1 or less, the gradients overflow by
            # themselves.
            if loss_scale_skip(scale):
                return []
        elif where == {"grads"} and self.context.mixed_precision:
            self._skips += 1  # the loss scale at work, unless it keeps happening
            if self._skips < self.settings.mixed_precision_skips:
                return []
        self._bad_steps += 1
        if self.firing and where <= self._seen:
            return []
        first = not self.firing
        self._seen |= where
        ordered = [o for o in ORIGINS if o in where]
        origin = ordered[0]
        bad_variables = [
            name.removeprefix(GRAD_NORM_PREFIX)
            for name in self.context.in_model_order(
                n for n, v in values.items() if n.startswith(GRAD_NORM_PREFIX) and not finite(v)
            )
        ]
        evidence: NonfiniteEvidence = {
            "origin": origin,
            "where": ordered,
            "counts": counts,
            "first_step": record.step,
            "steps_nonfinite": self._bad_steps,
            "last_finite_loss": self._last_loss,
            "last_grad_norm": self._last_norm,
        }
        if bad_variables:
            evidence["variables"] = bad_variables[:10]
        if first:
            message = _first_message(origin, ordered, counts, record.step, "loss" not in where)
        else:
            message = (
                f"NaN/Inf now also in the {listing([_PLACE[o] for o in ordered])} "
                f"(step {record.step})"
            )
        return [self.fire("", record, "critical", message, NONFINITE_HINTS[origin], evidence)]


def _first_message(
    origin: str, ordered: list[str], counts: dict[str, float], step: int, loss_finite: bool
) -> str:
    count = counts.get(origin)
    amount = f" ({count:.0f} values)" if count is not None and math.isfinite(count) else ""
    if origin == "inputs":
        head = f"NaN/Inf in the input batch itself at step {step}{amount}"
    elif origin == "weights" and loss_finite:
        head = (
            f"The weights are NaN/Inf since step {step}{amount} while the loss is finite: "
            "the model is silently poisoned"
        )
    elif origin == "weights":
        head = f"The weights hold NaN/Inf at step {step}{amount}"
    elif origin == "loss":
        head = f"The loss became NaN/Inf at step {step} on a clean input batch"
    else:
        head = f"The gradients are NaN/Inf at step {step}{amount} while the loss is finite"
    rest = [_PLACE[o] for o in ordered[1:]]
    return head + (f"; the {listing(rest)} followed" if rest else "")
