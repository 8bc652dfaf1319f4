"""Rules on gradient norms: exploding (far above their baseline) and vanishing."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainvitals.detect import settings as s
from trainvitals.detect.base import KINDS_KEPT, Context, Rule, finite
from trainvitals.detect.rate import RateWatch
from trainvitals.detect.stats import MAD_TO_SIGMA, RollingWindow, median
from trainvitals.detect.text import number
from trainvitals.detect.text import ratio as ratio_text
from trainvitals.detect.types import Finding, Record
from trainvitals.protocol import ArrayColumns
from trainvitals.series import GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX, LOSS, LR

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
    watches = (GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX, LR)

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
        self._rate = RateWatch(settings)

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        column = dense.get(GRAD_GLOBAL_NORM)
        cfg = self.settings
        if column is None:
            return self._rates(dense)
        if "" in self.firing or len(self._baseline) < cfg.min_history or self.regime_pending:
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
        return self._rates(dense)

    def _rates(self, dense: Mapping[str, ArrayColumns]) -> list[Finding]:
        """The frame's learning rates, taken in bulk (each step's, in order)."""
        column = dense.get(LR)
        if column is None:
            return []
        out = []
        steps, times, rates = column
        for i, (step, lr) in enumerate(zip(steps.tolist(), rates.tolist(), strict=True)):
            if self._rate.feed(step, lr):
                out.append(self._rate_finding(Record(step, float(times[i]), {})))
        return out

    def _rate_finding(self, record: Record) -> Finding:
        rise = self._rate.rising
        if rise is None:
            return self.resolve("lr", record)
        message = (
            f"The learning rate rose to {number(rise.lr)} at step {rise.step}, "
            f"{ratio_text(rise.ratio)} its highest before ({number(rise.before)}): every "
            "update is that much larger, and the gradients and the loss blow up soon after"
        )
        evidence = {
            "lr_before": rise.before,
            "ratio": rise.ratio,
            **self.context.lr_evidence(record.step),
            "lr": rise.lr,
        }
        return self.fire("lr", record, "warning", message, LR_RISE_HINT, evidence)

    def observe(self, record: Record) -> list[Finding]:
        lr = record.values.get(LR)
        rate = lr is not None and self._rate.feed(record.step, lr)
        return ([self._rate_finding(record)] if rate else []) + self._observe_norm(record)

    def _observe_norm(self, record: Record) -> list[Finding]:
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
        elif "" in self.firing and self._calm >= cfg.clear_steps:
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


LR_RISE_HINT = (
    "If the schedule was not meant to rise again (a callback or a restart that set the rate, "
    "a schedule's units in epochs rather than steps), set it back; save a checkpoint now, "
    "and clip gradients (`clipnorm=1.0`) so that the larger updates cannot blow up."
)

#: A learning rate this many times what it was at the loss's best makes dead gradients its
#: own symptom, not vanishing (the same factor as ``grad_explosion``'s ``lr_rise``).
RATE_RISEN = 3.0
#: ...with the loss's recent median this many times its best (``loss_divergence``'s
#: ``min_ratio``).
LOSS_RISEN = 1.5

GRAD_VANISHING_HINT = (
    "Gradients die on their way back through the network: use ReLU/GELU instead of "
    "sigmoid/tanh in deep stacks, He initialisation (`kernel_initializer='he_normal'`), "
    "BatchNormalization or residual connections. If every gradient is tiny, raise the "
    "learning rate or check that the loss depends on the weights at all."
)


#: A layer: its name, and the per-variable norm series of its kernels, in model order.
Layer = tuple[str, tuple[str, ...]]


def layers_of(kernels: Sequence[str]) -> list[Layer]:
    """Per-variable norm series of kernels (in model order) grouped by the layer that holds
    them: the first component of their paths below the components all of them share (a
    model's own name over its layers), in the order of each layer's first kernel. A layer of
    one kernel is named by the kernel's path, one of several by the layer's."""
    paths = [k.removeprefix(GRAD_NORM_PREFIX).split("/") for k in kernels]
    common = 0
    while paths and all(len(p) > common + 1 and p[common] == paths[0][common] for p in paths):
        common += 1
    layers: dict[str, list[str]] = {}
    for kernel, parts in zip(kernels, paths, strict=True):
        layers.setdefault("/".join(parts[: common + 1]), []).append(kernel)
    return [
        (name if len(members) > 1 else members[0].removeprefix(GRAD_NORM_PREFIX), tuple(members))
        for name, members in layers.items()
    ]


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
        self._dead = 0
        self._recovered = 0
        self._losses: deque[float] = deque(maxlen=settings.window)
        #: A frame's losses taken in bulk, (step, loss), joining ``_losses`` only once the
        #: record being judged reaches their step: the flat-loss test reads no later loss.
        self._pending: deque[tuple[int, float]] = deque()
        #: A record's names -> the layers of its per-variable norms (:meth:`_layers_in`).
        self._layers: dict[tuple[str, ...], list[Layer]] = {}
        #: The lowest loss yet and the learning rate at its step (None: no rate recorded).
        self._best_loss = math.inf
        self._lr_at_best: float | None = None

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
            self._add_loss(*pending.popleft())

    def _add_loss(self, step: int, loss: float) -> None:
        self._losses.append(loss)
        if loss < self._best_loss:
            self._best_loss, self._lr_at_best = loss, self.context.lr_at(step)

    def _rate_killed(self, step: int) -> bool:
        """Whether the learning rate is :data:`RATE_RISEN` times or more what it was when the
        loss was at its best, and the loss well above that best: gradients that die after
        such a rise (ReLUs a blow-up killed) are the rate's doing, which ``grad_explosion``
        and ``loss_divergence`` name."""
        lr = self.context.lr_at(step)
        before = self._lr_at_best
        if lr is None or before is None or not before > 0 or lr < RATE_RISEN * before:
            return False
        # A warm-up also raises the rate past the first steps' best loss; only a loss that
        # climbed well away from its best since (a blow-up) makes the death the rate's.
        recent = list(self._losses)[len(self._losses) // 2 :]
        return self._best_loss > 0 and median(recent) >= LOSS_RISEN * self._best_loss

    def observe(self, record: Record) -> list[Finding]:
        cfg = self.settings
        values = record.values
        self._catch_up(record.step)
        loss = values.get(LOSS)
        if finite(loss):
            self._add_loss(record.step, loss)  # type: ignore[arg-type]
        out: list[Finding] = []
        norm = values.get(GRAD_GLOBAL_NORM)
        if finite(norm):
            self._tiny = self._tiny + 1 if norm < cfg.min_norm else 0  # type: ignore[operator]
            if self._tiny >= cfg.window and not self.firing:
                out.append(self._all_tiny(record, norm, self._tiny))  # type: ignore[arg-type]
        layers = self._layer_norms(values)
        if len(layers) < 3:
            return out
        # Vanishing through depth starves every early layer, each with all its kernels: an
        # attention's query and key kernels alone get 1e-6 of the head's gradient at
        # initialisation in a healthy transformer, its value and output kernels do not. The
        # early third's middle layer (the lower of two) stands for it, not its least fed.
        early = sorted(layers[: max(1, len(layers) // 3)], key=lambda layer: layer[1])
        low_name, low = early[(len(early) - 1) // 2]
        top_name, top = max(layers, key=lambda layer: layer[1])
        # Every kernel's gradient exactly zero (dead ReLUs everywhere: only the biases after
        # them still learn) is the vanishing at its worst, not the absence of a ratio.
        ratio = low / top if top > 0 else 0.0
        if ratio < cfg.layer_ratio:
            self._low += 1
            self._recovered = 0
        else:
            self._low = 0
            self._recovered += 1 if ratio >= cfg.layer_ratio * 10 else 0
        self._dead = self._dead + 1 if top <= 0 else 0
        # Every kernel's gradient exactly zero is no noise to wait out: fewer samples do.
        starved = self._low >= cfg.samples or self._dead >= cfg.dead_samples
        change = self._loss_change() if not self.firing and starved else None
        if change is not None and change < cfg.flat_loss and not self._rate_killed(record.step):
            said = (
                f"{low_name} gets {ratio_text(ratio)} the gradient of {top_name}"
                if top > 0
                else "every layer's kernel gets a gradient of exactly zero (dead units?)"
            )
            message = (
                f"Gradients vanish in the early layers: {said}, and the loss improved "
                f"{max(change, 0.0):.1%} over the last {len(self._losses)} steps"
            )
            evidence = {
                "early_variable": low_name,
                "early_norm": low,
                "top_variable": top_name,
                "top_norm": top,
                "ratio": ratio,
                "samples": self._low,
                "loss_improvement": change,
                "layers": {
                    n.removeprefix(GRAD_NORM_PREFIX): values[n]
                    for _, kernels in self._layers_in(values)
                    for n in kernels
                    if finite(values[n])
                },
            }
            out.append(self.fire("", record, "warning", message, GRAD_VANISHING_HINT, evidence))
        elif self.firing and self._recovered >= cfg.samples:
            out.append(self.resolve("", record))
        return out

    def _layer_norms(self, values: Mapping[str, float]) -> list[tuple[str, float]]:
        """Each layer's gradient norm (that of its kernels with a finite norm, together), in
        model order; layers with none left out."""
        out = []
        for name, kernels in self._layers_in(values):
            squares = [values[k] ** 2 for k in kernels if finite(values[k])]
            if squares:
                out.append((name, math.sqrt(sum(squares))))
        return out

    def _layers_in(self, values: Mapping[str, float]) -> list[Layer]:
        """The layers of a record's per-variable norms, in model order: of their kernels only,
        where there are any."""
        names = tuple(values)
        layers = self._layers.get(names)
        if layers is None:  # records of one kind share their names: grouped once per kind
            # (each name's place in the model is fixed once noted, and noted before this)
            kernels = [n for n in names if n.startswith(GRAD_NORM_PREFIX) and "kernel" in n]
            if not kernels:
                kernels = [n for n in names if n.startswith(GRAD_NORM_PREFIX)]
            if len(self._layers) >= KINDS_KEPT:  # a client sending ever other names
                self._layers.clear()
            layers = self._layers[names] = layers_of(self.context.in_model_order(kernels))
        return layers

    def _loss_change(self) -> float | None:
        """Relative improvement of the loss from the first to the second half of the window."""
        losses = list(self._losses)
        if len(losses) < self.settings.window // 2:
            return None
        half = len(losses) // 2
        before, after = median(losses[:half]), median(losses[half:])
        return (before - after) / max(abs(before), 1e-12)
