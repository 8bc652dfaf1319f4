"""Memory rules: the OOM forecast and memory pressure."""

from __future__ import annotations

import random

import pytest

from tests.detect.streams import T0, GiB, fired, host, run_through
from trainvitals.detect import (
    Detector,
)

# -- memory --------------------------------------------------------------------------------


def test_a_steady_leak_forecasts_the_oom_with_its_eta() -> None:
    noise = random.Random(0)
    leak = 4 * 2**20  # 4 MiB/s from 1 GiB: the 4 GiB limit is 768 s away at t=0
    book, changes = run_through(Detector(), host(lambda t: GiB + leak * t + noise.gauss(0, 2**20)))
    assert changes[0][:3] == ("fired", "oom_forecast", "warning")
    alert = book.alerts[("oom_forecast", "host")]
    eta = alert.evidence["eta_s"]
    expected = (4 * GiB - (GiB + leak * (alert.updated_time - T0))) / leak
    assert eta == pytest.approx(expected, rel=0.1)
    assert alert.evidence["forecast"]["value"][1] == 4 * GiB
    assert alert.evidence["slope"] == pytest.approx(leak, rel=0.05)
    assert "MiB/min" in alert.message


def test_a_leak_far_from_its_limit_and_noisy_flat_memory_raise_nothing() -> None:
    noise = random.Random(0)
    slow = Detector().feed(host(lambda t: GiB + 1000 * t, limit=64 * GiB))
    flat = Detector().feed(host(lambda t: 3 * GiB + noise.gauss(0, 50 * 2**20)))
    warmup = Detector().feed(host(lambda t: GiB * min(1.0, 0.3 + t / 10)))
    assert fired(slow + flat + warmup, "oom_forecast") == []


def test_memory_pressure_escalates_with_the_fraction_used() -> None:
    _, changes = run_through(Detector(), host(lambda t: (0.5 + t / 300 * 0.5) * 4 * GiB))
    pressure = [c[:3] for c in changes if c[1] == "memory_pressure"]
    assert pressure == [
        ("fired", "memory_pressure", "warning"),
        ("updated", "memory_pressure", "critical"),
    ]
