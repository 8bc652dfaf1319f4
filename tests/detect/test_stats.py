"""Robust statistics: the Theil-Sen trend, the rolling median and MAD, and the exceedance
test."""

from __future__ import annotations

import itertools
import random

import pytest

from trainvitals.detect.stats import RollingWindow, exceedance_p, theil_sen

# -- statistics ----------------------------------------------------------------------------


def test_theil_sen_ignores_outliers_and_reports_agreement() -> None:
    times = [float(t) for t in range(100)]
    values = [1000 + 5 * t for t in times]
    values[10] = 1e9  # a reading taken mid-allocation
    values[50] = 0
    trend = theil_sen(times, values)
    assert trend.slope == pytest.approx(5, rel=1e-6)
    assert trend.at(99) == pytest.approx(1000 + 5 * 99, rel=1e-6)
    assert trend.agreement > 0.9
    noise = random.Random(1)
    flat = theil_sen(times, [1000 + noise.gauss(0, 10) for _ in times])
    assert flat.agreement < 0.7


def test_rolling_window_median_and_mad() -> None:
    window = RollingWindow(5, refresh=1)
    for value in (1, 2, 3, 100, 4):
        window.add(value)
    assert (window.median, window.mad) == (3, 1)
    for value in (10, 10, 10, 10, 10):
        window.add(value)
    assert (window.median, window.mad) == (10, 0)


@pytest.mark.parametrize(("recent", "base", "above"), [(3, 4, 1), (2, 5, 0), (4, 3, 2)])
def test_the_exceedance_p_value_is_the_share_of_orderings_giving_as_many(
    recent: int, base: int, above: int
) -> None:
    """Every ordering of distinct exchangeable values is equally likely: the p-value is the
    share of them in which at least so many new values beat the bar that ``above`` of the
    earlier values beat (the bar just under the base's ``above + 1``-th largest)."""
    for over in range(recent + 2):
        hits = total = 0
        for ranks in itertools.permutations(range(recent + base)):
            earlier, new = sorted(ranks[:base], reverse=True), ranks[base:]
            bar = earlier[above] + 0.5 if above < base else -1
            hits += sum(r > bar for r in new) >= over
            total += 1
        assert exceedance_p(over, recent, above, base) == pytest.approx(hits / total), over
