"""The detector: which series are judged, and how system samples are thinned."""

from __future__ import annotations

import math

import numpy as np

from tests.detect.streams import T0
from trainvitals.detect.base import KINDS_KEPT
from trainvitals.detect.engine import Detector, _sparse, records
from trainvitals.detect.numeric import GradVanishingRule
from trainvitals.protocol import Clock, ClockedSeries, Columns

# -- engine ------------------------------------------------------------------------------


def test_system_samples_beyond_25_a_second_are_judged_at_25_a_second() -> None:
    dense = Columns(
        list(range(200)), [T0 + i * 0.01 for i in range(200)], [float(i) for i in range(200)]
    )
    on_one_clock = ClockedSeries.of({"host/rss": dense, "grad/norm/w": dense})
    sparse = _sparse(on_one_clock, ["host/rss", "grad/norm/w"])
    steps, times, values = sparse["host/rss"]
    assert len(steps) in (50, 51)  # a bucket of 0.04 s each, the last sample of each
    assert values[-1] == 199.0 and min(np.diff(times)) > 0.02
    assert sparse["grad/norm/w"] == dense  # not a system sample: every one of them
    per_second = Columns([1, 2, 3], [T0, T0 + 1, T0 + 2], [1.0, 2.0, 3.0])
    assert _sparse(ClockedSeries.of({"host/rss": per_second}), ["host/rss"]) == {
        "host/rss": per_second
    }


def test_series_on_one_clock_are_judged_as_the_same_series_each_on_its_own() -> None:
    """The detector reads a frame's clocks as they come; series that merely share their
    steps and times find the same, whether sent on one clock or each with its own."""
    steps = list(range(1, 301))
    times = [T0 + 0.01 * s for s in steps]
    norms = [1.0] * 250 + [1e6] * 50  # an explosion at step 251
    losses = [0.5] * 299 + [math.nan]
    plain = {"loss": Columns(steps, times, losses),
             "grad/global_norm": Columns(steps, times, norms),
             "host/rss": Columns([300], [times[-1]], [1e9])}  # fmt: skip
    clock = Clock(steps, times)
    clocked = ClockedSeries(
        [clock, Clock([300], [times[-1]])],
        {"loss": (0, losses), "grad/global_norm": (0, norms), "host/rss": (1, [1e9])},
    )
    assert clocked == plain
    found = [(f.rule, f.step, f.firing) for f in Detector().feed(clocked)]
    assert found == [(f.rule, f.step, f.firing) for f in Detector().feed(plain)]
    assert ("nonfinite", 300, True) in found
    assert list(records(clocked)) == list(records(plain))


def test_a_client_sending_ever_other_names_keeps_what_the_detector_learns_bounded() -> None:
    detector = Detector()
    for i in range(1, 500):
        at = Columns([i], [T0 + i], [1.0])
        detector.feed({"loss": at, f"grad/norm/v{i}/kernel": at, f"grad/norm/w{i}/kernel": at})
    vanishing = next(rule for rule in detector.rules if isinstance(rule, GradVanishingRule))
    assert 0 < len(detector.context._kinds) <= KINDS_KEPT
    assert 0 < len(vanishing._layers) <= KINDS_KEPT
