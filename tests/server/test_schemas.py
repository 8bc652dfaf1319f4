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


def test_series_that_name_a_clock_read_its_steps_and_times() -> None:
    frame = parse_frame(
        '{"type": "points", "v": 1, "seq": 3, "clocks": {"0": {"step": [1, 2], "time": [1.5, '
        '2.5]}}, "series": {"loss": {"clock": "0", "value": [0.5, NaN]}, "lr": {"clock": "0", '
        '"value": [0.1, 0.1]}, "host/rss": {"step": [2], "time": [2.6], "value": [7.0]}}}'
    )
    assert isinstance(frame, Points)
    columns = frame.columns()
    assert columns["lr"] == ([1, 2], [1.5, 2.5], [0.1, 0.1])
    assert columns["loss"].steps == [1, 2] and math.isnan(columns["loss"].values[1])
    assert columns["host/rss"] == ([2], [2.6], [7.0])
    # The frame's clock is held once and the series that share it say so: the server packs
    # and converts it once, and pushes it once to the browsers.
    assert columns["loss"].steps is columns["lr"].steps
    assert columns["loss"].times is columns["lr"].times
    assert len(columns.clocks) == 2 and columns.sharing() == [2, 1]
    assert columns.series["lr"] == (0, [0.1, 0.1])


ONE = '{"0": {"step": [1], "time": [1.0]}}'


def _clocked(clocks: str, series: str) -> str:
    return f'{{"type": "points", "v": 1, "seq": 1, "clocks": {clocks}, "series": {series}}}'


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            _clocked(ONE, '{"loss": {"clock": "1", "value": [1]}}'),
            "series 'loss' names a clock the frame does not hold",
        ),
        (
            _clocked(ONE, '{"loss": {"clock": "0", "value": []}}'),
            "series 'loss' has 0 values for its clock's 1 steps",
        ),
        (
            _clocked('{"0": {"step": [1, 2], "time": [1.0]}}', "{}"),
            "at clocks.0: Value error, step and time must have equal lengths",
        ),
        (
            _clocked(
                ONE,
                '{"loss": {"clock": "0", "step": [1], "time": [1.0], "value": [1]}}',
            ),
            "names a clock or has step and time, not both",
        ),
        (_clocked("{}", '{"loss": {"value": [1]}}'), "needs step and time, or a clock"),
        (
            # 3 MB: under the frame limit, over what one frame may cost the server.
            _clocked(
                f'{{"0": {{"step": [{", ".join(["1"] * 100_001)}], "time": '
                f"[{', '.join(['1.0'] * 100_001)}]}}}}",
                "{"
                + ", ".join(
                    f'"s{i}": {{"clock": "0", "value": [{",".join(["0"] * 100_001)}]}}'
                    for i in range(5)
                )
                + "}",
            ),
            "500005 points in one frame, more than 500000",
        ),
        (
            _clocked('{"0": {"step": [1], "time": [Infinity]}}', "{}"),
            "at clocks.0.time.0",
        ),
        (
            _clocked('{"0\\n": {"step": [1], "time": [1.0]}}', "{}"),
            "at clocks.0\\n",
        ),
    ],
)
def test_invalid_clocks_give_a_short_reason(text: str, reason: str) -> None:
    with pytest.raises(FrameError) as info:
        parse_frame(text)
    assert reason in str(info.value)


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
        # What reached the database and raised there before (#15): every one a 1007 now.
        ("[]", "expected a JSON object, got list"),
        ("null", "expected a JSON object, got NoneType"),
        ('{"type": "points", "v": 1, "seq": 9223372036854775808, "series": {}}', "at seq"),
        (
            '{"type": "points", "v": 1, "seq": 1, "series": {"loss": '
            '{"step": [9223372036854775808], "time": [1.0], "value": [1.0]}}}',
            "series.loss.step.0",
        ),
        (json.dumps({**HELLO, "pid": 2**64}), "at pid"),
        (
            '{"type": "hello", "v": 1, "run_id": "a", "project": "p", "name": "n", '
            '"started_at": NaN}',
            "started_at: Input should be a finite number",
        ),
        (
            '{"type": "points", "v": 1, "seq": 1, "series": {"loss": '
            '{"step": [1], "time": [NaN], "value": [1.0]}}}',
            "series.loss.time.0",
        ),
        ('{"type": "end", "v": 1, "seq": 1, "reason": "x", "time": Infinity}', "at time"),
        (json.dumps({**HELLO, "name": "a\u0000b"}), "at name"),
        (
            json.dumps(
                {
                    "type": "end",
                    "v": 1,
                    "seq": 1,
                    "reason": "x",
                    "time": 1.0,
                    "traceback": "a\u0000b",
                }
            ),
            "at traceback",
        ),
        (json.dumps({**HELLO, "host": "h" * 256}), "at host"),
    ],
)
def test_invalid_frames_give_a_short_reason(text: str, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        parse_frame(text)


def test_a_series_name_cannot_forge_a_log_line() -> None:
    frame = {
        "type": "points",
        "v": 1,
        "seq": 1,
        "series": {"loss\nERROR forged": {"step": [1], "time": [1.0], "value": [1.0]}},
    }
    with pytest.raises(FrameError) as caught:
        parse_frame(json.dumps(frame))
    assert "\n" not in str(caught.value) and "loss\\nERROR" in str(caught.value)
