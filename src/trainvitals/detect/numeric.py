"""Rules on the numbers of training itself: NaN/Inf, gradient norms, the loss."""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trainvitals.detect import settings as s
from trainvitals.detect.base import KINDS_KEPT, Context, Rule, finite
from trainvitals.detect.stats import MAD_TO_SIGMA, RollingWindow, median
from trainvitals.detect.text import listing, number
from trainvitals.detect.text import ratio as ratio_text
from trainvitals.detect.types import Finding, Record, Severity
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
        evidence: dict[str, Any] = {
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


GRAD_EXPLOSION_HINT = (
    "Clip gradients (e.g. `keras.optimizers.Adam(learning_rate, clipnorm=1.0)`) and lower the "
    "learning rate or lengthen its warm-up. If one layer dominates the rise, check its "
    "initialisation and normalisation. Under mixed precision keep the LossScaleOptimizer. "
    "Save a checkpoint now: the loss usually turns NaN soon after."
)


#: Norms of a variable before its last that its rise is measured against.
_VARIABLE_WINDOW = 20


class GradExplosionRule(Rule):
    """The global gradient norm far above its robust baseline (median/MAD of log10 norms).

    Variables that join the training mid-run (a backbone unfrozen for fine-tuning) start a
    new regime: the global norm now sums more gradients, and may well jump tenfold at once.
    The baseline starts again from that step, so the jump is measured against nothing older
    than the change.
    """

    id = "grad_explosion"
    watches = (GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX)

    def __init__(self, context: Context, settings: s.GradExplosion) -> None:
        super().__init__(context)
        self.settings = settings
        self._baseline = RollingWindow(settings.window)
        self._lagging: deque[float] = deque()
        self._above = 0
        self._calm = 0
        # Per-variable norms: each one's last few, from which the variables that rose most
        # over their own median are named when the rule fires (worked out then, not at every
        # step: a run logs them for every layer at every step).
        self._norms: dict[str, deque[float]] = {}

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        column = dense.get(GRAD_GLOBAL_NORM)
        if column is None:
            return []
        cfg = self.settings
        if self.firing or len(self._baseline) < cfg.min_history or self.regime_pending:
            return None  # firing, about to judge for the first time, a new regime: step by step
        values = column[2]
        levels = np.log10(values[np.isfinite(values) & (values > 0)])
        centre = self._baseline.median
        spread = max(MAD_TO_SIGMA * self._baseline.mad, 0.05)
        excess = levels - centre
        if np.any((excess >= math.log10(cfg.factor)) & (excess / spread >= cfg.min_z)):
            return None
        if len(levels) and self._baseline.values:
            # The baseline is refreshed as the frame's norms join it: a step judged step by
            # step may meet a lower centre than this one. None can be below the lowest norm
            # in play, so a frame whose norms all stay within `factor` of that cannot fire.
            lowest = min(min(self._baseline.values), min(self._lagging, default=math.inf))
            if float(levels.max()) - min(lowest, float(levels.min())) >= math.log10(cfg.factor):
                return None
        self._above = 0
        self._calm += len(levels)
        self._lagging.extend(levels.tolist())
        overflow = len(self._lagging) - cfg.lag
        if overflow > 0:
            self._baseline.extend([self._lagging.popleft() for _ in range(overflow)])
        return []

    def observe(self, record: Record) -> list[Finding]:
        cfg = self.settings
        if self.new_regime(record.step):  # the norms before it are no baseline for after
            self._baseline = RollingWindow(cfg.window)
            self._lagging.clear()
            self._above = 0
        for name, value in record.values.items():
            # finite and positive (NaN compares false, None is no norm)
            if value is not None and 0.0 < value < math.inf and name.startswith(GRAD_NORM_PREFIX):
                norms = self._norms.get(name)
                if norms is None:
                    norms = self._norms[name] = deque(maxlen=_VARIABLE_WINDOW + 1)
                norms.append(value)
        norm = record.values.get(GRAD_GLOBAL_NORM)
        if norm is None or not finite(norm) or norm <= 0:
            return []
        level = math.log10(norm)
        self._lagging.append(level)
        if len(self._lagging) > cfg.lag:
            self._baseline.add(self._lagging.popleft())
        if len(self._baseline) < cfg.min_history:
            return []
        centre = self._baseline.median
        spread = max(MAD_TO_SIGMA * self._baseline.mad, 0.05)
        ratio = 10 ** (level - centre)
        hot = ratio >= cfg.factor and (level - centre) / spread >= cfg.min_z
        if hot:
            self._above += 1
            self._calm = 0
        else:
            self._above = 0
            self._calm += 1
        severity = "critical" if ratio >= cfg.critical_factor else "warning"
        if hot and (self._above >= cfg.sustain or severity == "critical"):
            current = self.firing.get("")
            if current is None or (current == "warning" and severity == "critical"):
                return [self._fire(record, norm, 10**centre, ratio, severity)]
        elif self.firing and self._calm >= cfg.clear_steps:
            return [self.resolve("", record)]
        return []

    def _rises(self) -> list[tuple[str, float, float]]:
        """(variable, its last norm, that norm over the median of its up to 20 before), for
        each variable with 3 norms or more before its last, the largest rise first."""
        rises = []
        for name, norms in self._norms.items():
            if len(norms) > 3:
                *before, last = norms
                level = median([math.log10(norm) for norm in before])  # the median level
                rises.append((name, last, 10 ** (math.log10(last) - level)))
        return sorted(rises, key=lambda rise: -rise[2])

    def _fire(
        self, record: Record, norm: float, baseline: float, ratio: float, severity: Any
    ) -> Finding:
        layers = self._rises()[:3]
        evidence: dict[str, Any] = {
            "norm": norm,
            "baseline": baseline,
            "ratio": ratio,
            "steps_above": self._above,
            "layers": [
                {"variable": name.removeprefix(GRAD_NORM_PREFIX), "norm": n, "ratio": r}
                for name, n, r in layers
            ],
            **self.context.lr_evidence(record.step),
        }
        if self.regime is not None:
            evidence["baseline_since"] = self.regime
        message = (
            f"Gradient norm {number(norm)} is {ratio_text(ratio)} its recent baseline "
            f"{number(baseline)}"
        )
        if layers and layers[0][2] >= 3:
            name, _, rise = layers[0]
            layer = name.removeprefix("grad/norm/")
            message += f"; the largest rise is in {layer} ({ratio_text(rise)})"
        return self.fire("", record, severity, message, GRAD_EXPLOSION_HINT, evidence)


GRAD_VANISHING_HINT = (
    "Gradients die on their way back through the network: use ReLU/GELU instead of "
    "sigmoid/tanh in deep stacks, He initialisation (`kernel_initializer='he_normal'`), "
    "BatchNormalization or residual connections. If every gradient is tiny, raise the "
    "learning rate or check that the loss depends on the weights at all."
)


class GradVanishingRule(Rule):
    """Early layers' gradients orders of magnitude below the rest while the loss is flat,
    or every gradient near zero, for a sustained window."""

    id = "grad_vanishing"
    watches = (LOSS, GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX)

    def __init__(self, context: Context, settings: s.GradVanishing) -> None:
        super().__init__(context)
        self.settings = settings
        self._tiny = 0
        self._low = 0
        self._recovered = 0
        self._losses: deque[float] = deque(maxlen=settings.window)
        #: A frame's losses taken in bulk, (step, loss), joining ``_losses`` only once the
        #: record being judged reaches their step: the flat-loss test reads no later loss.
        self._pending: deque[tuple[int, float]] = deque()
        #: A record's names -> its per-variable norms in model order (:meth:`_ordered`).
        self._layers: dict[tuple[str, ...], list[str]] = {}

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        cfg = self.settings
        self._catch_up(None)
        if LOSS in dense:
            steps, _, losses = dense[LOSS]
            keep = np.isfinite(losses)
            self._pending.extend(zip(steps[keep].tolist(), losses[keep].tolist(), strict=True))
        if GRAD_GLOBAL_NORM not in dense:
            return []
        steps, times, norms = dense[GRAD_GLOBAL_NORM]
        keep = np.isfinite(norms)
        steps, times, norms = steps[keep], times[keep], norms[keep]
        if not len(norms):
            return []
        small = norms < cfg.min_norm
        # The tiny norms in a row at each step, counting those before the frame.
        index = np.arange(len(norms))
        last_big = np.maximum.accumulate(np.where(small, -1 - self._tiny, index))
        tiny = index - last_big
        self._tiny = int(tiny[-1])
        reached = np.flatnonzero(tiny >= cfg.window)
        if len(reached) and not self.firing:  # at the very step the window filled
            at = int(reached[0])
            record = Record(int(steps[at]), float(times[at]), {})
            return [self._all_tiny(record, float(norms[at]), int(tiny[at]))]
        return []

    def _all_tiny(self, record: Record, norm: float, steps: int) -> Finding:
        message = (
            f"The gradient norm has stayed below {self.settings.min_norm:g} for {steps} "
            "steps: nothing is learning"
        )
        evidence = {"global_norm": norm, "steps": steps}
        return self.fire("", record, "warning", message, GRAD_VANISHING_HINT, evidence)

    def _catch_up(self, step: int | None) -> None:
        """The pending losses up to ``step`` (all of them: None) join the window."""
        pending = self._pending
        while pending and (step is None or pending[0][0] <= step):
            self._losses.append(pending.popleft()[1])

    def observe(self, record: Record) -> list[Finding]:
        cfg = self.settings
        values = record.values
        self._catch_up(record.step)
        loss = values.get(LOSS)
        if finite(loss):
            self._losses.append(loss)  # type: ignore[arg-type]
        out: list[Finding] = []
        norm = values.get(GRAD_GLOBAL_NORM)
        if finite(norm):
            self._tiny = self._tiny + 1 if norm < cfg.min_norm else 0  # type: ignore[operator]
            if self._tiny >= cfg.window and not self.firing:
                out.append(self._all_tiny(record, norm, self._tiny))  # type: ignore[arg-type]
        ordered = self._ordered(values)
        if len(ordered) < 3:
            return out
        early = ordered[: max(1, len(ordered) // 3)]
        low_name = min(early, key=lambda n: values[n])
        top_name = max(ordered, key=lambda n: values[n])
        top = values[top_name]
        ratio = values[low_name] / top if top > 0 else 1.0
        if ratio < cfg.layer_ratio:
            self._low += 1
            self._recovered = 0
        else:
            self._low = 0
            self._recovered += 1 if ratio >= cfg.layer_ratio * 10 else 0
        change = self._loss_change() if not self.firing and self._low >= cfg.samples else None
        if change is not None and change < cfg.flat_loss:
            low, top_short = (
                low_name.removeprefix(GRAD_NORM_PREFIX),
                top_name.removeprefix(GRAD_NORM_PREFIX),
            )
            message = (
                f"Gradients vanish in the early layers: {low} gets {ratio_text(ratio)} the "
                f"gradient of {top_short}, and the loss improved {max(change, 0.0):.1%} over the "
                f"last {len(self._losses)} steps"
            )
            evidence = {
                "early_variable": low,
                "early_norm": values[low_name],
                "top_variable": top_short,
                "top_norm": top,
                "ratio": ratio,
                "samples": self._low,
                "loss_improvement": change,
                "layers": {n.removeprefix(GRAD_NORM_PREFIX): values[n] for n in ordered},
            }
            out.append(self.fire("", record, "warning", message, GRAD_VANISHING_HINT, evidence))
        elif self.firing and self._recovered >= cfg.samples:
            out.append(self.resolve("", record))
        return out

    def _ordered(self, values: Mapping[str, float]) -> list[str]:
        """The per-variable norms of a record that are finite, in model order: kernels only,
        where there are any."""
        names = tuple(values)
        layers = self._layers.get(names)
        if layers is None:  # records of one kind share their names: sorted once per kind
            # (each name's place in the model is fixed once noted, and noted before this)
            kernels = [n for n in names if n.startswith(GRAD_NORM_PREFIX) and "kernel" in n]
            if not kernels:
                kernels = [n for n in names if n.startswith(GRAD_NORM_PREFIX)]
            if len(self._layers) >= KINDS_KEPT:  # a client sending ever other names
                self._layers.clear()
            layers = self._layers[names] = self.context.in_model_order(kernels)
        if all(finite(values[n]) for n in layers):
            return layers
        return [n for n in layers if finite(values[n])]

    def _loss_change(self) -> float | None:
        """Relative improvement of the loss from the first to the second half of the window."""
        losses = list(self._losses)
        if len(losses) < self.settings.window // 2:
            return None
        half = len(losses) // 2
        before, after = median(losses[:half]), median(losses[half:])
        return (before - after) / max(abs(before), 1e-12)


LOSS_DIVERGENCE_HINT = (
    "Lower the learning rate (or decay it, or add warm-up) and clip gradients "
    "(`clipnorm=1.0`); resume from the checkpoint with the lowest loss. If it began at a "
    "data or schedule boundary, check that change (a learning-rate step, shuffled labels, a "
    "new data shard)."
)
LOSS_SPIKE_HINT = (
    "One batch's loss jumped far above the level: often a bad or mislabelled batch, or an "
    "outlier the model can't fit. Repeated spikes that grow precede a divergence: clip "
    "gradients and look at the batch."
)


class LossDivergenceRule(Rule):
    """The batch loss's level (a rolling median) rising well above its running minimum,
    giving back what training had learned; and single-batch spikes (info)."""

    id = "loss_divergence"
    watches = (LOSS,)
    _EVERY = 5  # steps between judgements of the level

    def __init__(self, context: Context, settings: s.LossDivergence) -> None:
        super().__init__(context)
        self.settings = settings
        # The last losses: the newest `smooth` give the level, all of them the minimum's
        # level and the noise.
        self._losses: deque[float] = deque(maxlen=max(settings.minimum_window, settings.smooth))
        self._early: list[float] = []
        self._start: float | None = None
        self._minimum = math.inf
        self._level: float | None = None
        self._seen = 0
        self._since = 0
        self._above = 0
        self._calm = 0
        self._spike_at = -1

    def observe(self, record: Record) -> list[Finding]:
        loss = record.values.get(LOSS)
        if loss is None or not math.isfinite(loss):
            return []
        cfg = self.settings
        out: list[Finding] = []
        self._seen += 1
        self._losses.append(loss)
        level, start = self._level, self._start
        if level is not None and start is not None and level > 0:
            if loss > cfg.spike_factor * level and loss > start:
                if "spike" not in self.firing:
                    message = (
                        f"Loss spiked to {number(loss)} at step {record.step}, "
                        f"{ratio_text(loss / level)} its level {number(level)}"
                    )
                    evidence = {"loss": loss, "level": level, "start": start}
                    out.append(
                        self.fire("spike", record, "info", message, LOSS_SPIKE_HINT, evidence)
                    )
                self._spike_at = record.step
            elif "spike" in self.firing and record.step - self._spike_at >= cfg.smooth:
                out.append(self.resolve("spike", record))
        if self._seen <= cfg.warmup_steps:
            return out
        if self._start is None:
            self._early.append(loss)
            if len(self._early) >= cfg.early_steps:
                self._start = median(self._early)
                self._level = self._recent_level()
            return out
        self._since += 1
        if self._since < self._EVERY:
            return out
        self._since = 0
        return out + self._judge(record, self._EVERY)

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        """The frame's losses in bulk, judged at the very steps :meth:`observe` judges them
        (every ``_EVERY`` steps, each on the losses up to it), so that what fires and when
        is a function of the stream, not of where the agent cut it into frames."""
        column = dense.get(LOSS)
        if column is None:
            return []
        if self._start is None or "spike" in self.firing:
            return None  # the warm-up and a spike's end are judged step by step
        cfg = self.settings
        steps, times, values = column
        keep = np.isfinite(values)
        if not keep.all():
            steps, times, values = steps[keep], times[keep], values[keep]
        n = len(values)
        if not n:
            return []
        window = self._losses.maxlen or 1
        history = np.fromiter(self._losses, np.float64, len(self._losses))
        if len(history) < window:
            return None  # a window still filling (a long minimum window): step by step
        losses = np.concatenate([history, values])
        # The frame's judgements: the steps at which the count since the last one reaches
        # _EVERY, as indices into the frame and into `losses`.
        at = np.arange(self._EVERY - self._since - 1, n, self._EVERY)
        ends = at + window
        smooth = min(cfg.smooth, window)
        levels = np.median(sliding_window_view(losses, smooth)[ends - smooth + 1], axis=1)
        slow = np.median(sliding_window_view(losses, window)[ends - window + 1], axis=1)
        jumps = np.abs(np.diff(losses))
        spread = (
            MAD_TO_SIGMA
            * np.median(sliding_window_view(jumps, window - 1)[ends - window + 1], axis=1)
            / math.sqrt(2)
            if window > 1
            else np.zeros(len(at))
        )
        # A spike is judged against the level of the last judgement before its step.
        judged = np.concatenate([[np.nan if self._level is None else self._level], levels])
        level_then = judged[np.searchsorted(at, np.arange(n), side="left")]
        start = self._start
        if np.any((level_then > 0) & (values > cfg.spike_factor * level_then) & (values > start)):
            return None
        self._seen += n
        self._losses.extend(values[-window:].tolist())
        self._since = (self._since + n) % self._EVERY
        out: list[Finding] = []
        for i, j in enumerate(at.tolist()):
            noise = 1.2533 * float(spread[i]) / math.sqrt(min(window, cfg.smooth))
            record = Record(int(steps[j]), float(times[j]), {})
            out += self._verdict(record, self._EVERY, float(levels[i]), float(slow[i]), noise)
        return out

    def _recent_level(self) -> float:
        smooth = self.settings.smooth
        return median(list(self._losses)[-smooth:])

    def _judge(self, record: Record, advanced: int) -> list[Finding]:
        """Compare the level with the minimum and the start; ``advanced`` steps since the
        last judgement."""
        cfg = self.settings
        slow = list(self._losses)
        # The standard error of the level (a median of `smooth` losses), from the spread of
        # the recent losses: taken from one loss to the next, so that the rise itself is no
        # "noise" (a spread around the window's median counts the jump from the old level to
        # the new as noise, and hides it until the window is all new): 1.4826 x the median
        # step, over sqrt(2), estimates the losses' standard deviation, and a median's
        # standard error is 1.2533 x that over the square root of its count.
        steps = [abs(b - a) for a, b in pairwise(slow)]
        spread = MAD_TO_SIGMA * median(steps) / math.sqrt(2) if steps else 0.0
        noise = 1.2533 * spread / math.sqrt(min(len(slow), cfg.smooth))
        return self._verdict(record, advanced, self._recent_level(), median(slow), noise)

    def _verdict(
        self, record: Record, advanced: int, level: float, slow_level: float, noise: float
    ) -> list[Finding]:
        """One judgement: the level (median of the last ``smooth`` losses) against the
        minimum and the start, with the slow level (median of the whole window) and the
        level's noise."""
        cfg = self.settings
        out: list[Finding] = []
        self._level = level
        start = self._start
        assert start is not None
        if len(self._losses) == self._losses.maxlen:
            self._minimum = min(self._minimum, slow_level)
        low = min(self._minimum, slow_level)
        learned = start - low
        if learned > 0.05 * abs(start):
            rising = (
                level - low >= cfg.lost_fraction * learned
                and (level >= cfg.min_ratio * low if low > 0 else True)
                and level - low >= cfg.noise_z * noise
            )
            severity: Severity = "critical" if level > start else "warning"
        else:  # nothing learned yet: only a loss far above where it started counts
            rising = start > 0 and level >= 2 * start
            severity = "critical" if start > 0 and level >= 3 * start else "warning"
        if rising:
            self._above += advanced
            self._calm = 0
        else:
            self._above = 0
            self._calm += advanced
        if rising and self._above >= cfg.sustain:
            current = self.firing.get("")
            if current is None or (current == "warning" and severity == "critical"):
                gave_back = (level - low) / learned if learned > 0 else math.inf
                # A ratio to the minimum means something only above zero (a log-likelihood
                # loss goes below it): there, how far above the minimum it is.
                above = (
                    f"{ratio_text(level / low)} its minimum"
                    if low > 0
                    else f"{number(level - low)} above its minimum"
                )
                message = (
                    f"Loss is rising: its level {number(level)} is {above} {number(low)}"
                    f" (it started at {number(start)})"
                )
                if severity == "critical":
                    message = "Training is diverging: " + message[0].lower() + message[1:]
                evidence = {
                    "level": level,
                    "minimum": low,
                    "start": start,
                    "given_back": gave_back,
                    "steps_rising": self._above,
                    **self.context.lr_evidence(record.step),
                }
                out.append(self.fire("", record, severity, message, LOSS_DIVERGENCE_HINT, evidence))
        elif "" in self.firing and self._calm >= cfg.sustain:
            out.append(self.resolve("", record))
        return out
