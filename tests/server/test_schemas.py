from __future__ import annotations

import json
import math

import pytest

from trainvitals.exceptions import FrameError
from trainvitals.server.schemas import Hello, Points, parse_frame

HELLO = {
    "type": "hello",
    "v": 1,
    "run_id": "abc123",
    "project": "p",
    "name": "n",
    "started_at": 1.0,
}


def test_valid_frames_parse_to_their_types() -> None:
    assert isinstance(parse_frame(json.dumps(HELLO)), Hello)
    frame = parse_frame(
        '{"type": "points", "v": 1, "seq": 3, "series": {"loss": '
        '{"step": [1, 2], "time": [1.0, 2.0], "value": [NaN, Infinity]}}}'
    )
    assert isinstance(frame, Points)
    values = frame.series["loss"].value
    assert math.isnan(values[0]) and values[1] == math.inf


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not valid JSON"),
        ('{"type": "hello", "v": 2}', "unsupported protocol version 2"),
        ('{"type": "telemetry", "v": 1}', "unknown frame type"),
        ('{"type": "points", "v": 1, "seq": 0, "series": {}}', "at seq"),
        (
            '{"type": "points", "v": 1, "seq": 1, "series": {"loss": '
            '{"step": [1, 2], "time": [1.0], "value": [1.0]}}}',
            "equal lengths",
        ),
        (
            '{"type": "points", "v": 1, "seq": 1, "series": {"loss": '
            '{"step": [1], "time": [1.0], "value": ["high"]}}}',
            "series.loss.value.0",
        ),
        (json.dumps({**HELLO, "run_id": "../etc"}), "at run_id"),
    ],
)
def test_invalid_frames_give_a_short_reason(text: str, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        parse_frame(text)
