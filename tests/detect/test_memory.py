"""Memory rules: the OOM forecast and memory pressure."""

from __future__ import annotations

import random

import pytest

from tests.detect.streams import T0, GiB, Stream, fired, host, run_through
from trainvitals.detect import Detector, Finding, RuleSet
from trainvitals.detect.memory import ProcessMemory
from trainvitals.protocol import Columns

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


def test_a_leak_that_fills_the_limit_in_seconds_is_forecast_before_the_kill() -> None:
    """The zoo's fast leaks: 1.4 GiB filled within 10-20 s of training, gone before the
    20 s of samples a forecast otherwise waits for."""
    noise = random.Random(1)
    fill = 0.2 * GiB  # a second, from 1 GiB: the 4 GiB limit is reached at t=15
    stream = host(lambda t: min(4 * GiB, GiB + fill * t + noise.gauss(0, 2**20)))
    first = fired(Detector().feed(stream), "oom_forecast")[0]
    assert first.severity == "critical"
    assert first.time - T0 <= 10.0  # at least 5 s before the kill
    assert first.evidence["eta_s"] == pytest.approx(15 - (first.time - T0), abs=1.5)


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


def test_the_working_set_is_judged_not_the_rss_that_counts_shared_libraries() -> None:
    seconds = range(0, 60)
    at = [T0 + t for t in seconds]
    stream: Stream = {  # the RSS above the limit (1 GiB of libraries); the cgroup's count at half
        "host/rss": Columns([7] * 60, at, [4.5 * GiB] * 60),
        "host/working_set": Columns([7] * 60, at, [2.0 * GiB] * 60),
        "host/limit": Columns([7] * 60, at, [4.0 * GiB] * 60),
    }
    assert Detector().feed(stream) == []
    rss_only = {name: column for name, column in stream.items() if name != "host/working_set"}
    (pressure,) = fired(Detector().feed(rss_only), "memory_pressure")
    assert "100% of its limit: 4 GiB of 4 GiB" in pressure.message  # never above the limit


def fits(
    memory: ProcessMemory, levels: list[float | tuple[float, float]], limit: float = 4 * GiB
) -> list[Finding]:
    """One detector a fit, as the server makes one a run: 30 s of flat readings a fit, 10 s
    apart, the runs sharing the process's memory rules (a level ``(a, b)``: a fit whose
    readings climb from ``a`` to ``b`` in its first 5 s, then hold)."""
    found = []
    for fit, level in enumerate(levels):
        detector = Detector(memory=memory.rules)
        memory.join(f"run-{fit}", f"fold-{fit}", detector.context)
        at = [T0 + 40 * fit + t for t in range(30)]
        low, high = level if isinstance(level, tuple) else (level, level)
        found += detector.feed(
            {
                "host/working_set": Columns(
                    [1] * 30,
                    at,
                    [low + (high - low) * min(t / 5, 1) + (t % 3) * 2**20 for t in range(30)],
                ),
                "host/limit": Columns([1] * 30, at, [limit] * 30),
            }
        )
    return found


def test_growth_between_fits_is_forecast_once_for_the_process_with_the_loops_remedies() -> None:
    memory = ProcessMemory(RuleSet())
    found = fits(memory, [GiB + fit * 200 * 2**20 for fit in range(8)])
    forecasts = fired(found, "oom_forecast")
    changes = [memory.book.apply(f) for f in found]
    assert next(c[0] for c in changes if c is not None and c[1].rule == "oom_forecast") == "fired"
    assert len({c[1].id for c in changes if c is not None}) == 1  # one alert, updated after
    # The readings' trend spans the fits and forecasts first; from the fifth fit on (four
    # floors after the first fit's, whose floor is its start-up) the one alert names the loop.
    first = next(f for f in forecasts if f.evidence["trend"] == "between_fits")
    assert T0 + 40 * 4 <= first.time < T0 + 40 * 5
    assert first.evidence["growth_per_fit"] == pytest.approx(200 * 2**20, rel=0.05)
    assert "clear_session()" in first.hint and "tf.data" in first.hint
    (alert,) = memory.book.alerts.values()
    assert [r["name"] for r in memory.spans(alert.id)][-1] == "fold-7"


def test_a_loop_that_builds_once_in_its_first_fits_raises_nothing() -> None:
    """The first fit's floor is its first reading, before the fit built its graph, its
    optimizer's slots and its data pipeline (the zoo's forked runs: 24 MiB, then 152 MiB for
    good within the fit); the second fit finds them in place: a one-off climb is no leak."""
    memory = ProcessMemory(RuleSet())
    levels: list[float | tuple[float, float]] = [(0.02 * GiB, 0.15 * GiB)]
    levels += [0.15 * GiB + fit * 2**20 for fit in range(40)]
    assert fits(memory, levels, limit=1.4 * GiB) == []


def test_a_loop_whose_fits_free_what_they_took_raises_nothing() -> None:
    memory = ProcessMemory(RuleSet())
    assert fits(memory, [GiB + (fit % 2) * 50 * 2**20 for fit in range(10)]) == []
    alone = fits(ProcessMemory(RuleSet()), [GiB + fit * 200 * 2**20 for fit in range(2)])
    assert alone == []  # two fits are no trend
