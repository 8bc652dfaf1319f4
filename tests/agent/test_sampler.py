"""The per-second sampler: a failing source is dropped, the schedule doesn't drift, and
stopping is instant."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import pytest

from harness.polling import wait_for
from trainvitals.agent.sampler import Sampler

if TYPE_CHECKING:
    from trainvitals.agent.gpu import GpuDescription


class Broken:
    name = "broken"

    def describe(self) -> GpuDescription:
        return {}

    def sample(self) -> dict[str, float]:
        raise OSError("sensor gone")


class Counting:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def describe(self) -> GpuDescription:
        return {}

    def sample(self) -> dict[str, float]:
        self.calls += 1
        return {"x": float(self.calls)}


def test_a_failing_source_is_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    recorded: list[dict[str, float]] = []
    counting = Counting()
    sampler = Sampler([Broken(), counting], lambda v: recorded.append(dict(v)))
    with caplog.at_level(logging.WARNING, logger="trainvitals"):
        sampler.sample_once()
        sampler.sample_once()
    assert recorded == [{"x": 1.0}, {"x": 2.0}]
    assert [r.getMessage() for r in caplog.records] == [
        "trainvitals: broken readings stopped: OSError: sensor gone"
    ]


def test_schedule_follows_the_clock_without_drift_and_stops_at_once() -> None:
    now = [100.0]
    samples: list[float] = []
    sampled = threading.Event()

    class Slow(Counting):
        def sample(self) -> dict[str, float]:
            samples.append(now[0])
            now[0] += 0.3  # each sample takes 0.3 s of the injected clock
            sampled.set()
            return {"x": 1.0}

    def advance(timeout: float) -> bool:  # waiting, on fake time
        now[0] += timeout
        return len(samples) >= 4

    sampler = Sampler([Slow()], lambda v: None, interval=1.0, clock=lambda: now[0], wait=advance)
    sampler.start()
    wait_for(lambda: len(samples) >= 4, timeout=5, what="four samples")
    sampler.stop(timeout=5)
    assert samples == [100.0, 101.0, 102.0, 103.0]  # every second on the dot, not every 1.3 s

    real = Sampler([Counting()], lambda v: None, interval=3600)
    real.start()
    started = time.monotonic()
    real.stop(timeout=5)
    # An hour's wait is cut short: stop() returns before its 5 s join would give up.
    assert time.monotonic() - started < 4
