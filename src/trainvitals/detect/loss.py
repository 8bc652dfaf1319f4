"""The ``loss_divergence`` rule: the loss giving back what training had learned."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import pairwise

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trainvitals.detect import settings as s
from trainvitals.detect.base import Context, Rule
from trainvitals.detect.stats import MAD_TO_SIGMA, exceedance_p, median
from trainvitals.detect.text import number
from trainvitals.detect.text import ratio as ratio_text
from trainvitals.detect.types import Finding, Record, Severity
from trainvitals.protocol import ArrayColumns
from trainvitals.series import LOSS

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


@dataclass(frozen=True)
class Tail:
    """The newest ``tail_recent`` losses and their mean; and the upper quantile, mean and
    standard deviation of the ``minimum_window`` losses that end ``tail_lag`` steps before
    them (the base they are measured against).
    """

    recent: np.ndarray
    mean: float
    bar: float
    #: How many of the base are above the bar.
    above: int
    base_mean: float
    base_sd: float


class LossDivergenceRule(Rule):
    """The batch loss's level (a rolling median) rising well above its running minimum,
    giving back what training had learned; and single-batch spikes (info)."""

    id = "loss_divergence"
    watches = (LOSS,)
    _EVERY = 5  # steps between judgements of the level

    def __init__(self, context: Context, settings: s.LossDivergence) -> None:
        super().__init__(context)
        self.settings = settings
        # The last losses: the newest `smooth` give the level, the newest `_window` the
        # minimum's level and the noise; with the tail on, `tail_lag + tail_recent` more
        # before those make the tail's base.
        self._window = max(settings.minimum_window, settings.smooth)
        self._tail_on = (
            settings.tail_p > 0
            and 1 <= settings.tail_recent <= self._window
            and 0 < settings.tail_quantile < 1
        )
        self._kept = self._window + (
            settings.tail_lag + settings.tail_recent if self._tail_on else 0
        )
        self._losses: deque[float] = deque(maxlen=self._kept)
        self._early: list[float] = []
        self._start: float | None = None
        self._first: list[float] = []
        #: Where training started, warm-up included: what it has learned is measured from
        #: here where that is higher than the start.
        self._origin: float | None = None
        self._minimum = math.inf
        #: The learning rate when the level was at its minimum (None: the run records none).
        self._lr_at_minimum: float | None = None
        self._level: float | None = None
        self._seen = 0
        self._since = 0
        self._above = 0
        self._leaping = 0
        self._tailing = 0
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
            if self._seen <= cfg.first_steps:
                self._first.append(loss)
            return out
        if self._start is None:
            self._early.append(loss)
            if len(self._early) >= cfg.early_steps:
                self._start = median(self._early)
                self._origin = max(self._start, median(self._first)) if self._first else None
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
        window, kept = self._window, self._kept
        history = np.fromiter(self._losses, np.float64, len(self._losses))
        if len(history) < kept:
            return None  # the windows still filling: step by step
        losses = np.concatenate([history, values])
        # The frame's judgements: the steps at which the count since the last one reaches
        # _EVERY, as indices into the frame and into `losses`.
        at = np.arange(self._EVERY - self._since - 1, n, self._EVERY)
        ends = at + kept
        smooth = min(cfg.smooth, window)
        levels = np.median(sliding_window_view(losses, smooth)[ends - smooth + 1], axis=1)
        fast = min(cfg.fast, window)
        quick = np.median(sliding_window_view(losses, fast)[ends - fast + 1], axis=1)
        slow = np.median(sliding_window_view(losses, window)[ends - window + 1], axis=1)
        jumps = np.abs(np.diff(losses))
        spread = (
            MAD_TO_SIGMA
            * np.median(sliding_window_view(jumps, window - 1)[ends - window + 1], axis=1)
            / math.sqrt(2)
            if window > 1
            else np.zeros(len(at))
        )
        tails = self._tails(losses, ends)
        windows = sliding_window_view(losses, window)  # a view: nothing copied
        # A spike is judged against the level of the last judgement before its step.
        judged = np.concatenate([[np.nan if self._level is None else self._level], levels])
        level_then = judged[np.searchsorted(at, np.arange(n), side="left")]
        start = self._start
        if np.any((level_then > 0) & (values > cfg.spike_factor * level_then) & (values > start)):
            return None
        self._seen += n
        self._losses.extend(values[-kept:].tolist())
        self._since = (self._since + n) % self._EVERY
        out: list[Finding] = []
        for i, j in enumerate(at.tolist()):
            noise = 1.2533 * float(spread[i]) / math.sqrt(min(window, cfg.smooth))
            record = Record(int(steps[j]), float(times[j]), {})
            out += self._verdict(
                record,
                self._EVERY,
                float(levels[i]),
                float(slow[i]),
                noise,
                partial(self._leap_noise, noise, windows[ends[i] - window + 1]),
                float(quick[i]),
                tails[i],
            )
        return out

    def _tails(self, losses: np.ndarray, ends: np.ndarray) -> list[Tail | None]:
        """The tail at each judgement, the losses up to ``losses[end]`` (one code path for
        the bulk and the step by step, so that both give the very same numbers)."""
        if not self._tail_on:
            return [None] * len(ends)
        cfg, window = self.settings, self._window
        recent = sliding_window_view(losses, cfg.tail_recent)[ends - cfg.tail_recent + 1]
        means = recent.mean(axis=1)
        bases = sliding_window_view(losses, window)[ends - self._kept + 1]
        bars = np.quantile(bases, cfg.tail_quantile, axis=1)
        above = (bases > bars[:, None]).sum(axis=1)
        base_means, base_sds = bases.mean(axis=1), bases.std(axis=1)
        return [
            Tail(recent[i], float(means[i]), float(bars[i]), int(above[i]), float(m), float(sd))
            for i, (m, sd) in enumerate(zip(base_means, base_sds, strict=True))
        ]

    def _recent_level(self) -> float:
        smooth = self.settings.smooth
        return median(list(self._losses)[-smooth:])

    def _judge(self, record: Record, advanced: int) -> list[Finding]:
        """Compare the level with the minimum and the start; ``advanced`` steps since the
        last judgement."""
        cfg = self.settings
        losses = list(self._losses)
        slow = losses[-self._window :]
        # The standard error of the level (a median of `smooth` losses), from the spread of
        # the recent losses: taken from one loss to the next, so that the rise itself is no
        # "noise" (a spread around the window's median counts the jump from the old level to
        # the new as noise, and hides it until the window is all new): 1.4826 x the median
        # step, over sqrt(2), estimates the losses' standard deviation, and a median's
        # standard error is 1.2533 x that over the square root of its count.
        steps = [abs(b - a) for a, b in pairwise(slow)]
        spread = MAD_TO_SIGMA * median(steps) / math.sqrt(2) if steps else 0.0
        noise = 1.2533 * spread / math.sqrt(min(len(slow), cfg.smooth))
        quick = median(slow[-cfg.fast :])
        tail = None
        if self._tail_on and len(losses) == self._kept:
            tail = self._tails(np.asarray(losses), np.array([self._kept - 1]))[0]
        level = self._recent_level()
        leap_noise = partial(self._leap_noise, noise, np.asarray(slow, dtype=np.float64))
        return self._verdict(record, advanced, level, median(slow), noise, leap_noise, quick, tail)

    def _leap_noise(self, noise: float, window: np.ndarray) -> float:
        """The level's noise as the leap judges it: from the window's interquartile range too
        (over 1.349: a standard deviation), where that is the larger. Small batches of a few
        classes give losses of two kinds, near zero and one wrong answer's: most steps go
        from one near zero to another, and the spread taken from step to step misses how
        often a median of five lands on the other kind."""
        upper, lower = np.percentile(window, [75, 25])
        quartiles = float(upper - lower)
        return max(noise, 1.2533 * quartiles / 1.349 / math.sqrt(self.settings.smooth))

    def _verdict(
        self,
        record: Record,
        advanced: int,
        level: float,
        slow_level: float,
        noise: float,
        leap_noise: Callable[[], float],
        quick: float,
        tail: Tail | None,
    ) -> list[Finding]:
        """One judgement: the level (median of the last ``smooth`` losses) against the
        minimum and the start, with the slow level (median of the whole window), the
        level's noise, the quick level (median of the last ``fast``) and the tail (None
        while the window fills)."""
        cfg = self.settings
        out: list[Finding] = []
        self._level = level
        start = self._start
        assert start is not None
        if len(self._losses) >= self._window:
            if slow_level < self._minimum:
                self._minimum = slow_level
                self._lr_at_minimum = self.context.lr_at(record.step)
        low = min(self._minimum, slow_level)
        learned = start - low
        if learned <= 0.05 * abs(start) and self._origin is not None:
            # Learned within the warm-up and nothing since: measured from the first losses.
            learned = self._origin - low
        over = 0  # the tail's losses over its bar
        if learned > 0.05 * abs(start):
            # The ratio to the minimum keeps a plateau's wobble quiet; for a run that learned
            # less than that ratio, half of what it learned given back is bar enough (else
            # only a loss already back at its start could fire).
            bar = min(cfg.min_ratio * low, low + cfg.half_back * learned) if low > 0 else low

            def given_back(level: float, z: float) -> bool:
                return (
                    level - low >= cfg.lost_fraction * learned
                    and level >= bar
                    and level - low >= z * noise
                )

            rising = given_back(level, cfg.noise_z)
            # A loss that leaps back (labels gone bad at once) is back at its start within a
            # few smoothing windows: the quick level, at the z its fewer losses call for,
            # counts the steps without waiting for the level.
            leap_z = cfg.fast_z * math.sqrt(cfg.smooth / cfg.fast)
            # The quartiles only ever raise the noise: read only once the rest is passed.
            if given_back(quick, leap_z) and quick - low >= leap_z * leap_noise():
                self._leaping += advanced
            else:
                self._leaping = 0
            # So many recent losses over the base's upper quantile that losses drawn alike
            # would hardly ever give as many, with their mean past the base's by the bars
            # the level has (and by its noise), is a tail that grows: a few labels wrong in
            # each small batch raise its mean long before its median. The base ends
            # `tail_lag` steps back, so that a rise has not reached it when it is found.
            if tail is not None:
                over = int((tail.recent > tail.bar).sum())
            if (  # the exact count last: it is the dearest to compute
                tail is not None
                and tail.mean - tail.base_mean
                >= max(
                    cfg.lost_fraction * learned,
                    cfg.tail_mean_z * tail.base_sd / math.sqrt(cfg.tail_recent),
                )
                and tail.mean
                >= min(cfg.min_ratio * tail.base_mean, tail.base_mean + cfg.half_back * learned)
                and exceedance_p(over, cfg.tail_recent, tail.above, self._window) <= cfg.tail_p
            ):
                self._tailing += advanced
            else:
                self._tailing = 0
            severity: Severity = "critical" if level > start else "warning"
        else:  # nothing learned yet: only a loss far above where it started counts
            rising = start > 0 and level >= 2 * start
            severity = "critical" if start > 0 and level >= 3 * start else "warning"
            self._leaping = self._tailing = 0
        self._above = self._above + advanced if rising else 0
        self._calm = 0 if rising or self._leaping or self._tailing else self._calm + advanced
        leapt = self._leaping >= cfg.fast_sustain
        tailed = self._tailing >= cfg.tail_sustain and tail is not None
        sustained = rising and self._above >= cfg.sustain
        if leapt and not sustained:
            level = max(level, quick)  # what the alert says is the level that leapt
            severity = "critical" if level > start else "warning"
        elif tailed and not sustained and tail is not None:
            level = max(level, tail.mean)  # what the tail's losses cost now
            severity = "critical" if level > start else "warning"
        if sustained or leapt or tailed:
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
                if tailed and not sustained and not leapt and tail is not None:
                    message = (
                        f"Loss is rising: {over} of the last {cfg.tail_recent} losses were "
                        f"above the {round(100 * cfg.tail_quantile)}th percentile of the "
                        f"{self._window} before them, and their mean {number(level)} is "
                        f"{above} {number(low)} (it started at {number(start)})"
                    )
                if severity == "critical":
                    message = "Training is diverging: " + message[0].lower() + message[1:]
                evidence = {
                    "level": level,
                    "minimum": low,
                    "start": start,
                    "given_back": gave_back,
                    "steps_rising": self._above,
                    **({"tail": over, "tail_of": cfg.tail_recent} if tailed else {}),
                    **self.context.lr_evidence(record.step),
                }
                if self._lr_at_minimum is not None and "lr" in evidence:
                    # A rate risen since training was at its best, not since a warm-up's
                    # first step, tells a rate blow-up from bad data.
                    evidence["lr_at_minimum"] = self._lr_at_minimum
                out.append(self.fire("", record, severity, message, LOSS_DIVERGENCE_HINT, evidence))
        elif "" in self.firing and self._calm >= cfg.sustain:
            out.append(self.resolve("", record))
        return out
