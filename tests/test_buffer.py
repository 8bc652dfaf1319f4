from __future__ import annotations

import math

from trainvitals.buffer import PointBuffer, points_frames
from trainvitals.protocol import MAX_POINTS_PER_FRAME


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
