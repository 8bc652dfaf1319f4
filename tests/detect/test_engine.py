"""The detector: which series are judged, and how system samples are thinned."""

from __future__ import annotations

import numpy as np

from tests.detect.streams import T0
from trainvitals.detect.engine import _thinned
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
