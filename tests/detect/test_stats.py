"""Robust statistics: the Theil-Sen trend and the rolling median and MAD."""

from __future__ import annotations

import random

import pytest

from trainvitals.detect.stats import RollingWindow, theil_sen

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
