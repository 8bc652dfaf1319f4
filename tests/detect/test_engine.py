"""The detector: which series are judged, and how system samples are thinned."""

from __future__ import annotations

import numpy as np

from tests.detect.streams import T0
from trainvitals.detect.base import KINDS_KEPT
from trainvitals.detect.engine import Detector, _thinned
from trainvitals.detect.numeric import GradVanishingRule
from trainvitals.protocol import Columns

# -- engine ------------------------------------------------------------------------------


def test_system_samples_beyond_25_a_second_are_judged_at_25_a_second() -> None:
    dense = Columns(
        list(range(200)), [T0 + i * 0.01 for i in range(200)], [float(i) for i in range(200)]
    )
    steps, times, values = _thinned(dense)
    assert len(steps) in (50, 51)  # a bucket of 0.04 s each, the last sample of each
    assert values[-1] == 199.0 and min(np.diff(times)) > 0.02
    per_second = Columns([1, 2, 3], [T0, T0 + 1, T0 + 2], [1.0, 2.0, 3.0])
    assert _thinned(per_second) == per_second


def test_a_client_sending_ever_other_names_keeps_what_the_detector_learns_bounded() -> None:
    detector = Detector()
    for i in range(1, 500):
        at = Columns([i], [T0 + i], [1.0])
        detector.feed({"loss": at, f"grad/norm/v{i}/kernel": at, f"grad/norm/w{i}/kernel": at})
    vanishing = next(rule for rule in detector.rules if isinstance(rule, GradVanishingRule))
    assert 0 < len(detector.context._kinds) <= KINDS_KEPT
    assert 0 < len(vanishing._layers) <= KINDS_KEPT
