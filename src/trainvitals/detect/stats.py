"""Robust statistics for streams: rolling median/MAD and a Theil-Sen trend.

Training signals are heavy-tailed (a noisy small-batch loss, one slow step at an epoch
boundary), so baselines are medians and spreads are median absolute deviations: one wild
value moves neither. Everything here is plain Python on small windows, cheap enough to run
on every point the server ingests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from trainvitals.exceptions import ConfigurationError

#: MAD times this estimates the standard deviation of normally distributed data.
MAD_TO_SIGMA = 1.4826


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    return _middle(sorted(values))


def _middle(ordered: Sequence[float]) -> float:
    """The median of a non-empty sequence already in order."""
    n = len(ordered)
    middle = n // 2
    if n % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


class RollingWindow:
    """The last ``size`` values, with their median and MAD (and, with ``trim``, their mean
    without the largest ``trim`` share of them).

    Sorting on every value would cost more than everything else a rule does, so the median
    and MAD are recomputed only every ``refresh`` additions (default: an eighth of the
    window); between refreshes they describe the window as it was a few values ago, which a
    baseline tolerates.
    """

    def __init__(self, size: int, refresh: int | None = None, trim: float | None = None) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self._refresh = max(1, refresh if refresh is not None else size // 8)
        self._since = 0
        self._median = 0.0
        self._mad = 0.0
        self._trim = trim
        self._trimmed = 0.0

    def add(self, value: float) -> None:
        self.values.append(value)
        self._since += 1
        if self._since >= self._refresh or len(self.values) <= self._refresh:
            self._recompute()

    def extend(self, values: Sequence[float]) -> None:
        """Add ``values`` in order, leaving the median and MAD exactly as :meth:`add` one at
        a time would: those of the window at the last refresh among them, so that a baseline
        does not depend on how its values were grouped."""
        early = 0
        while early < len(values) and len(self.values) < self._refresh:
            self.add(values[early])  # a window still small: each value refreshes
            early += 1
        rest = values[early:]
        # The last of the values at which `refresh` additions have accumulated.
        last = (len(rest) + self._since) // self._refresh * self._refresh - self._since
        if last > 0:
            self.values.extend(rest[:last])
            self._recompute()
            self.values.extend(rest[last:])
            self._since = len(rest) - last
        else:
            self.values.extend(rest)
            self._since += len(rest)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return self._median

    @property
    def mad(self) -> float:
        return self._mad

    @property
    def trimmed(self) -> float:
        """The mean without the largest ``trim`` share (0 unless made with ``trim``)."""
        return self._trimmed

    def _recompute(self) -> None:
        self._since = 0
        ordered = sorted(self.values)  # once, for the median and the trimmed mean
        centre = _middle(ordered)
        self._median = centre
        self._mad = median([abs(v - centre) for v in self.values])
        if self._trim is not None:
            self._trimmed = _trimmed(ordered, self._trim)


def trimmed_mean(values: Sequence[float], trim: float) -> float:
    """The mean of a non-empty sequence without its largest ``trim`` share (at least one
    value kept): what a share of long values moves, and a few rare ones do not."""
    return _trimmed(sorted(values), trim)


def _trimmed(ordered: Sequence[float], trim: float) -> float:
    kept = ordered[: max(1, len(ordered) - int(trim * len(ordered)))]
    return math.fsum(kept) / len(kept)


@dataclass(frozen=True)
class Trend:
    """A robust straight-line fit ``value = level + slope * (time - origin)``."""

    slope: float
    level: float  # fitted value at ``origin``
    origin: float
    #: Share of point pairs whose slope has the fitted slope's sign: 1.0 for a clean ramp,
    #: about 0.5 for noise around a flat line.
    agreement: float

    def at(self, time: float) -> float:
        return self.level + self.slope * (time - self.origin)


def theil_sen(times: Sequence[float], values: Sequence[float], max_points: int = 60) -> Trend:
    """Theil-Sen trend: the median of the slopes of all point pairs.

    Resistant to up to ~29% outliers (a step whose allocation was sampled mid-flight), with
    no assumption about the noise. Long windows are thinned evenly to ``max_points`` so the
    cost stays bounded (about 1,800 pairs).
    """
    n = len(times)
    if n < 2:
        raise ConfigurationError(f"Expected at least 2 points for a trend, but got {n}")
    if n > max_points:
        stride = (n - 1) / (max_points - 1)
        picks = [round(i * stride) for i in range(max_points)]
        times = [times[i] for i in picks]
        values = [values[i] for i in picks]
        n = max_points
    origin = times[-1]
    slopes = []
    for i in range(n - 1):
        ti, vi = times[i], values[i]
        for j in range(i + 1, n):
            dt = times[j] - ti
            if dt > 0:
                slopes.append((values[j] - vi) / dt)
    if not slopes:
        return Trend(0.0, median(values), origin, 0.0)
    slope = median(slopes)
    level = median([v - slope * (t - origin) for t, v in zip(times, values, strict=True)])
    if slope > 0:
        agreeing = sum(1 for s in slopes if s > 0)
    elif slope < 0:
        agreeing = sum(1 for s in slopes if s < 0)
    else:
        agreeing = 0
    return Trend(slope, level, origin, agreeing / len(slopes))


def exceedance_p(over: int, recent: int, above: int, base: int) -> float:
    """How likely ``over`` or more of ``recent`` new values exceed a bar that ``above`` of
    ``base`` earlier values exceed, were all of them exchangeable (drawn alike, in any
    order): the new values count at least ``over`` among the top ``over + above`` of all.
    Exact for any distribution, so that a heavy tail is no more alarming than a light one.
    """
    if over <= 0:
        return 1.0
    drawn = over + above
    total = recent + base
    if drawn > total:
        return 0.0
    tail = sum(
        math.comb(recent, x) * math.comb(base, drawn - x)
        for x in range(over, min(drawn, recent) + 1)
    )
    return tail / math.comb(total, drawn)
