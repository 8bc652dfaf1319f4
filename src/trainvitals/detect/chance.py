"""The ``loss_above_chance`` rule: a model whose loss starts far above what guessing gives,
the mark of weights drawn far too large or an output layer built wrong. A classifier's loss
at chance comes in the run's ``hello``; a regression's is measured on each batch's targets,
and comes with the first steps (``loss_at_chance``)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trainvitals.detect import settings as s
from trainvitals.detect.base import Context, Rule
from trainvitals.detect.stats import median
from trainvitals.detect.text import number
from trainvitals.detect.text import ratio as ratio_text
from trainvitals.detect.types import Finding, Record
from trainvitals.protocol import LOSS_AT_CHANCE, ArrayColumns
from trainvitals.series import CHANCE_LOSS, GRAD_GLOBAL_NORM, LOSS

LOSS_ABOVE_CHANCE_HINT = (
    "A fresh classifier's loss starts near chance (ln of the classes); far above it, the "
    "first predictions are confidently wrong. Check the kernel initialisers (Glorot or He, "
    "not a wide normal), the inputs' scale (normalise them), and that the last layer and "
    "the loss agree (`from_logits=True` for a layer without softmax, no softmax twice)."
)
REGRESSION_HINT = (
    "A fresh regression model's predictions start near zero at about the inputs' scale, so "
    "its loss starts near that of guessing 1 or -1; far above it, the first predictions are "
    "far too large. Check the kernel initialisers (Glorot or He, not a wide normal) and the "
    "inputs' scale (normalise them), and scale the targets if they span thousands."
)


def chance_of(env: Mapping[str, object]) -> tuple[float, int] | None:
    """The loss at chance and the classes, from the env the agent sent; None without them."""
    chance = env.get(LOSS_AT_CHANCE)
    if not isinstance(chance, Mapping):
        return None
    value, classes = chance.get("value"), chance.get("classes")
    # From the network: a bool is an int to isinstance, and says nothing here.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return float(value), classes


class LossAboveChanceRule(Rule):
    """The median of a model's first losses far above its loss at chance: warns once, at the
    step the first ``steps`` finite losses are in; resolves when the level of the last
    ``steps`` losses is back under the bar (a run that learned all the same). A classifier's
    level is the one its ``hello`` gave; a regression's, the median of the levels measured on
    the same first steps' batches, with its own factor."""

    id = "loss_above_chance"
    watches = (LOSS, GRAD_GLOBAL_NORM, CHANCE_LOSS)

    def __init__(self, context: Context, settings: s.LossAboveChance) -> None:
        super().__init__(context)
        self.settings = settings
        self._chance = chance_of(context.env)
        self._factor = settings.factor
        self._chances: list[tuple[int, float]] = []  # a regression's, (step, level)
        self._losses: deque[float] = deque(maxlen=settings.steps)
        self._first_norms: list[float] = []
        self._judged = False

    @property
    def _bar(self) -> float:
        assert self._chance is not None
        return self._factor * self._chance[0]

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        if GRAD_GLOBAL_NORM in dense and len(self._first_norms) < self.settings.steps:
            norms = dense[GRAD_GLOBAL_NORM][2]
            room = self.settings.steps - len(self._first_norms)
            self._first_norms += [float(v) for v in norms[np.isfinite(norms)][:room]]
        if CHANCE_LOSS in dense and len(self._chances) < self.settings.steps:
            at, _, chances = dense[CHANCE_LOSS]
            good = np.isfinite(chances) & (chances > 0)
            room = self.settings.steps - len(self._chances)
            kept = at[good][:room].tolist(), chances[good][:room].tolist()
            self._chances += zip(*kept, strict=True)
        if LOSS not in dense or (self._judged and not self.firing):
            return []
        steps, times, values = dense[LOSS]
        keep = np.isfinite(values)
        steps, times, values = steps[keep], times[keep], values[keep]
        if self.firing:  # every frame until it resolves: the level at each loss, in bulk
            return self._resolve_in(steps, times, values)
        out: list[Finding] = []
        for i, (step, time, loss) in enumerate(zip(steps, times, values, strict=True)):
            finding = self._take(Record(int(step), float(time), {}), float(loss))
            if finding is not None:
                out.append(finding)
            if self._judged:  # the rest of the frame, if it fired, goes in bulk
                if self.firing:
                    out += self._resolve_in(steps[i + 1 :], times[i + 1 :], values[i + 1 :])
                break
        return out

    def _resolve_in(
        self, steps: np.ndarray, times: np.ndarray, values: np.ndarray
    ) -> list[Finding]:
        """The first of these losses at which the median of the last ``steps`` is back under
        the bar resolves the alert; the window keeps what the next frame needs."""
        window = self.settings.steps
        losses = np.concatenate([np.fromiter(self._losses, np.float64), values])
        self._losses.extend(values[-window:].tolist())
        if len(losses) < window or not len(values):
            return []
        levels = np.median(sliding_window_view(losses, window), axis=1)[-len(values) :]
        under = np.flatnonzero(levels <= self._bar)
        if not len(under):
            return []
        at = int(under[0])
        return [self.resolve("", Record(int(steps[at]), float(times[at]), {}))]

    def observe(self, record: Record) -> list[Finding]:
        norm = record.values.get(GRAD_GLOBAL_NORM)
        if norm is not None and math.isfinite(norm):
            if len(self._first_norms) < self.settings.steps:
                self._first_norms.append(norm)
        chance = record.values.get(CHANCE_LOSS)
        if chance is not None and math.isfinite(chance) and chance > 0:
            if len(self._chances) < self.settings.steps:
                self._chances.append((record.step, chance))
        loss = record.values.get(LOSS)
        if loss is None or not math.isfinite(loss) or (self._judged and not self.firing):
            return []
        finding = self._take(record, loss)
        return [finding] if finding is not None else []

    def _take(self, record: Record, loss: float) -> Finding | None:
        if self._judged and not self.firing:
            return None  # judged once; resolved, it stays quiet for the rest of the run
        self._losses.append(loss)
        if len(self._losses) < self.settings.steps:
            return None
        level = median(list(self._losses))
        if self.firing:
            return self.resolve("", record) if level <= self._bar else None
        self._judged = True
        if self._chance is None:  # no classifier: a regression's level, if it sent one
            # Only the steps judged so far: a frame judged whole may hold later ones.
            chances = [chance for step, chance in self._chances if step <= record.step]
            if not chances:
                return None
            self._chance = (median(chances), 0)
            self._factor = self.settings.regression_factor
        if level <= self._bar:
            return None
        chance, classes = self._chance
        evidence: dict[str, object] = {
            "loss_start": level, "loss_at_chance": chance, "steps": self.settings.steps,
        }  # fmt: skip
        if classes:
            evidence["classes"] = classes
            guess = f"a model that guesses among {classes} classes"
            message_end, hint = "confidently wrong", LOSS_ABOVE_CHANCE_HINT
        else:
            guess = "guessing 1 or -1 for every target"
            message_end, hint = "far too large", REGRESSION_HINT
        message = (
            f"The loss started at {number(level)}, {ratio_text(level / chance)} the "
            f"{number(chance)} of {guess}: the first predictions are {message_end}"
        )
        if self._first_norms:
            evidence["grad_norm_start"] = median(self._first_norms)
        return self.fire("", record, "warning", message, hint, evidence)
