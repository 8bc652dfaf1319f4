from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainvitals.agent.buffer import PointBuffer, encode_points, points_frames
from trainvitals.protocol import MAX_POINTS_PER_FRAME, Columns
from trainvitals.server.schemas import Points, parse_frame


def test_frames_are_columnar_per_series_and_numbered() -> None:
    buffer = PointBuffer()
    buffer.add(1, 100.0, {"loss": 2.0, "accuracy": 0.1})
    buffer.add(2, 100.5, {"loss": math.nan})
    frames = points_frames(buffer.drain(), first_seq=7)
    assert len(buffer) == 0
    assert len(frames) == 1
    frame = frames[0]
    assert (frame["type"], frame["v"], frame["seq"]) == ("points", 1, 7)
    assert frame["series"]["loss"]["step"] == [1, 2]
    assert frame["series"]["loss"]["time"] == [100.0, 100.5]
    assert frame["series"]["loss"]["value"][0] == 2.0
    assert math.isnan(frame["series"]["loss"]["value"][1])
    assert frame["series"]["accuracy"] == {"step": [1], "time": [100.0], "value": [0.1]}


def test_large_batches_split_into_consecutive_frames() -> None:
    buffer = PointBuffer()
    for step in range(MAX_POINTS_PER_FRAME + 10):
        buffer.add(step, float(step), {"loss": 1.0})
    frames = points_frames(buffer.drain(), first_seq=1)
    assert [f["seq"] for f in frames] == [1, 2]
    sizes = [len(f["series"]["loss"]["step"]) for f in frames]
    assert sizes == [MAX_POINTS_PER_FRAME, 10]


def test_columns_join_what_was_added_step_by_step() -> None:
    advanced: list[tuple[int, float | None]] = []
    buffer = PointBuffer(on_step=lambda steps, at: advanced.append((steps, at)))
    buffer.add(1, 10.0, {"loss": 1.0})
    buffer.add_columns(
        {"loss": Columns([2, 3], [11.0, 12.0], [0.9, 0.8]), "lr": Columns([3], [12.0], [0.1])},
        clock=[(2, 5.5), (3, 5.6)],
    )
    assert len(buffer) == 4
    assert buffer.last_step == 3
    # the hang detector hears of each step at the moment it ended, not when the bulk came
    assert advanced == [(1, None), (1, 5.5), (1, 5.6)]
    frames = points_frames(buffer.drain(), first_seq=1)
    assert frames[0]["series"]["loss"] == {
        "step": [1, 2, 3],
        "time": [10.0, 11.0, 12.0],
        "value": [1.0, 0.9, 0.8],
    }
    assert frames[0]["series"]["lr"]["step"] == [3]


def test_frames_split_across_series_keep_every_point_once() -> None:
    buffer = PointBuffer()
    half = MAX_POINTS_PER_FRAME // 2 + 7
    steps = list(range(half))
    for name in ("a", "b", "c"):
        buffer.add_columns({name: Columns(steps, [0.0] * half, [1.0] * half)})
    frames = points_frames(buffer.drain(), first_seq=4)
    assert [f["seq"] for f in frames] == [4, 5]
    sizes = [sum(len(s["step"]) for s in f["series"].values()) for f in frames]
    assert sizes == [MAX_POINTS_PER_FRAME, 3 * half - MAX_POINTS_PER_FRAME]
    for name in ("a", "b", "c"):
        got = [s for f in frames if name in f["series"] for s in f["series"][name]["step"]]
        assert got == steps, name


def _one_frame(values: list[float]) -> dict[str, object]:
    steps = list(range(1, len(values) + 1))
    series = {"loss": Columns(steps, [1795317434.123457 + s for s in steps], values)}
    return points_frames(series, first_seq=3)[0]


def test_frames_are_encoded_compactly_and_read_back_exactly() -> None:
    frame = _one_frame([0.1, 2.5e-08, 1e16, 3.0, -0.0])
    text = encode_points(frame)
    assert " " not in text  # the fast encoder's compact form, not the standard library's
    assert json.loads(text) == frame
    parsed = parse_frame(text)
    assert isinstance(parsed, Points)
    assert parsed.series["loss"].value == [0.1, 2.5e-08, 1e16, 3.0, -0.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_value_is_sent_as_a_json_token_not_null(bad: float) -> None:
    frame = _one_frame([1.0, bad, 2.0])
    text = encode_points(frame)
    assert "null" not in text
    parsed = parse_frame(text)
    assert isinstance(parsed, Points)
    got = parsed.series["loss"].value
    assert got[0] == 1.0 and got[2] == 2.0
    assert (math.isnan(got[1]) and math.isnan(bad)) or got[1] == bad


def test_values_the_fast_encoder_does_not_take_are_encoded_as_before() -> None:
    frame = _one_frame([np.float64(0.5), 2**70, True])
    assert encode_points(frame) == json.dumps(frame)
    with pytest.raises(TypeError):  # what the standard encoder says of a numpy float32
        encode_points(_one_frame([np.float32(0.5)]))  # type: ignore[list-item]
