from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.agent.test_packing import ALL, vector
from trainvitals.agent import buffer as buffer_module
from trainvitals.agent import packing
from trainvitals.agent.buffer import (
    PointBuffer,
    PointsFrame,
    encode_points,
    points_frames,
    without_clocks,
)
from trainvitals.agent.packing import Row
from trainvitals.agent.vitals import StepVitals
from trainvitals.protocol import MAX_POINTS_PER_FRAME, ClockedSeries, Columns
from trainvitals.protocol import Clock as ProtocolClock
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


def _one_frame(values: list[float]) -> PointsFrame:
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


def _a_fits_second(steps: range) -> dict[str, Columns[list[int], list[float]]]:
    """What a fit hands over, as ``packing.decode`` gives it: vitals and metrics at each step
    (one steps list and one times list for all), the step time stamped a little later,
    per-variable norms every 10 steps (their own lists, shared), a system sample."""
    at = [1795317434.000001 + 0.002 * s for s in steps]
    every = [s for s in steps if s % 10 == 0]
    every_at = [1795317434.000001 + 0.002 * s for s in every]
    on_steps, sampled, sampled_at = list(steps), [steps[-1]], [at[-1]]
    return {
        "loss": Columns(on_steps, at, [1.0 / s for s in steps]),
        "nonfinite/grads": Columns(on_steps, at, [0.0 for _ in steps]),
        "accuracy": Columns(on_steps, at, [0.5 for _ in steps]),
        "step_time": Columns(list(steps), [t + 3e-6 for t in at], [0.002 for _ in steps]),
        "grad/norm/dense/kernel": Columns(every, every_at, [0.3 for _ in every]),
        "grad/norm/dense/bias": Columns(every, every_at, [0.1 for _ in every]),
        "host/rss": Columns(sampled, sampled_at, [7e8]),
        "host/limit": Columns(sampled, sampled_at, [8e9]),
    }


def test_series_on_one_clock_send_it_once_and_read_back_the_same() -> None:
    series = _a_fits_second(range(1, 401))
    plain = points_frames(series, first_seq=5)
    clocked = points_frames(series, first_seq=5, clocks=True)
    assert "clocks" not in plain[0]  # only for a server that says it reads them
    [frame] = clocked
    assert frame["clocks"] == {
        "0": {"step": list(range(1, 401)), "time": series["loss"].times},
        "1": {"step": series["grad/norm/dense/kernel"].steps,
              "time": series["grad/norm/dense/kernel"].times},
        "2": {"step": [400], "time": series["host/rss"].times},
    }  # fmt: skip
    named = {name: column.get("clock") for name, column in frame["series"].items()}
    assert named == {
        "loss": "0", "nonfinite/grads": "0", "accuracy": "0", "step_time": None,
        "grad/norm/dense/kernel": "1", "grad/norm/dense/bias": "1",
        "host/rss": "2", "host/limit": "2",
    }  # fmt: skip
    assert frame["series"]["loss"] == {"clock": "0", "value": series["loss"].values}
    texts = [encode_points(f) for f in (plain[0], frame)]
    assert len(texts[1]) < 0.7 * len(texts[0])
    parsed = [parse_frame(text) for text in texts]
    assert isinstance(parsed[0], Points) and isinstance(parsed[1], Points)
    assert parsed[1].columns() == parsed[0].columns() == series
    # Equal numbers in other lists are not looked for: a clock is the very same lists.
    alike = {n: Columns([1, 2], [1.0, 2.0], [0.5, 0.5]) for n in ("a", "b")}
    assert "clocks" not in points_frames(alike, first_seq=1, clocks=True)[0]


def test_the_buffer_keeps_the_clocks_it_is_handed_from_look_to_frame() -> None:
    buffer = PointBuffer()
    whole: dict[str, list[Columns[list[int], list[float]]]] = {}
    for first in (1, 201):  # two looks, then the sampler's reading
        look = _a_fits_second(range(first, first + 200))
        del look["host/rss"], look["host/limit"]
        buffer.add_columns(look)
        for name, column in look.items():
            whole.setdefault(name, []).append(column)
    buffer.add(buffer.last_step, 1795317435.0, {"host/rss": 7e8, "host/limit": 8e9})
    assert len(buffer) == 400 * 4 + 40 * 2 + 2
    [frame] = points_frames(buffer.drain(), first_seq=1, clocks=True)
    assert frame["clocks"]["0"]["step"] == list(range(1, 401))
    assert frame["clocks"]["1"]["step"] == list(range(10, 401, 10))
    assert frame["clocks"]["2"] == {"step": [400], "time": [1795317435.0]}
    assert [c.get("clock") for c in frame["series"].values()] == [
        "0", "0", "0", None, "1", "1", "2", "2",
    ]  # fmt: skip
    parsed = parse_frame(encode_points(frame))
    assert isinstance(parsed, Points)
    got = parsed.columns()
    for name, columns in whole.items():
        joined = [[x for column in columns for x in column[i]] for i in range(3)]
        assert got[name] == Columns(*joined)


def test_the_callbacks_rows_without_a_ring_go_on_one_clock_with_their_metrics() -> None:
    rows: list[Row] = [(s, float(s), vector(loss=1 / s), {"mae": s / 10}) for s in range(1, 9)]
    buffer = PointBuffer()
    buffer.add_columns(packing.pivot(rows, [], ALL, StepVitals(4), to_unix=1e9).columns)
    [frame] = points_frames(buffer.drain(), first_seq=1, clocks=True)
    assert frame["clocks"]["0"]["step"] == list(range(1, 9))
    assert frame["series"]["mae"] == {"clock": "0", "value": [s / 10 for s in range(1, 9)]}
    assert frame["series"]["loss"]["clock"] == "0"


def _parting_ways() -> tuple[PointBuffer, dict[str, list[tuple[int, float, float]]]]:
    """A buffer handed series that share steps, then not all of them, then more; and each
    series' points as handed over."""
    buffer = PointBuffer()
    expected: dict[str, list[tuple[int, float, float]]] = {}

    def hand_over(names: str, steps: list[int]) -> None:
        times = [s + 0.5 for s in steps]
        columns = {n: Columns(steps, times, [s * 10.0 + ord(n) for s in steps]) for n in names}
        buffer.add_columns(columns)
        for n, (ss, ts, vs) in columns.items():
            expected.setdefault(n, []).extend(zip(ss, ts, vs, strict=True))

    hand_over("abc", [1, 2])
    hand_over("ab", [3])  # c is not measured this time: a and b keep sharing
    hand_over("abcd", [4, 5])  # c and d come back, but a clock holds one history
    buffer.add(6, 6.5, {"a": 60.0 + ord("a"), "b": 60.0 + ord("b")})
    expected["a"].append((6, 6.5, 60.0 + ord("a")))
    expected["b"].append((6, 6.5, 60.0 + ord("b")))
    return buffer, expected


@pytest.mark.parametrize("clocks", [True, False])
def test_series_that_part_ways_keep_every_point_in_order(clocks: bool) -> None:
    buffer, expected = _parting_ways()
    assert len(buffer) == sum(len(points) for points in expected.values())
    [frame] = points_frames(buffer.drain(), first_seq=1, clocks=clocks)
    if clocks:  # a and b, still together
        assert frame["clocks"] == {"0": {"step": [1, 2, 3, 4, 5, 6],
                                         "time": [1.5, 2.5, 3.5, 4.5, 5.5, 6.5]}}  # fmt: skip
    parsed = parse_frame(encode_points(frame))
    assert isinstance(parsed, Points)
    got = {n: list(zip(*c, strict=True)) for n, c in parsed.columns().items()}
    assert got == expected


def test_clocked_series_are_taken_on_their_clocks() -> None:
    buffer = PointBuffer()
    for clock, a, b in (([1, 2], [1.0, 2.0], [3.0, 4.0]), ([3, 4], [5.0, 6.0], [7.0, 8.0])):
        times = [step + 0.5 for step in clock]
        buffer.add_columns(ClockedSeries([ProtocolClock(clock, times)], {"a": (0, a), "b": (0, b)}))
    [frame] = points_frames(buffer.drain(), first_seq=1, clocks=True)
    assert frame["clocks"] == {"0": {"step": [1, 2, 3, 4], "time": [1.5, 2.5, 3.5, 4.5]}}
    assert frame["series"]["b"] == {"clock": "0", "value": [3.0, 4.0, 7.0, 8.0]}


def test_a_clock_split_across_frames_stays_shared_and_within_the_budget() -> None:
    buffer = PointBuffer()
    steps = list(range(1, MAX_POINTS_PER_FRAME // 2 + 2))
    times = [float(s) for s in steps]
    buffer.add_columns({n: Columns(steps, times, [float(s) for s in steps]) for n in "xyz"})
    buffer.add(len(steps), 1e6, {"alone": 1.0})
    frames = points_frames(buffer.drain(), first_seq=1, clocks=True)
    assert [f["seq"] for f in frames] == [1, 2]
    for frame in frames:
        assert sum(len(c["value"]) for c in frame["series"].values()) <= MAX_POINTS_PER_FRAME
        assert set(frame["clocks"]) == {"0"}
    got = {n: [s for f in frames for s in f["clocks"]["0"]["step"]] for n in "xyz"}
    assert got == {n: steps for n in "xyz"}
    assert frames[1]["series"]["alone"] == {"step": [len(steps)], "time": [1e6], "value": [1.0]}
    assert all(isinstance(parse_frame(encode_points(f)), Points) for f in frames)


def test_a_clock_of_more_series_than_a_frame_holds_goes_series_by_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(buffer_module, "MAX_POINTS_PER_FRAME", 10)
    buffer = PointBuffer()
    buffer.add(1, 1.0, {f"s{i}": 1.0 for i in range(13)})
    buffer.add(2, 2.0, {f"s{i}": 2.0 for i in range(13)})
    frames = points_frames(buffer.drain(), first_seq=1, clocks=True)
    assert [len(f["series"]) for f in frames] == [5, 5, 3]
    assert all("clocks" not in f for f in frames)
    assert frames[2]["series"]["s12"] == {"step": [1, 2], "time": [1.0, 2.0], "value": [1.0, 2.0]}


def test_a_frame_with_clocks_reads_the_same_without_them_for_an_older_server() -> None:
    series = _a_fits_second(range(1, 41))
    series["loss"].values[3] = math.nan
    [frame] = points_frames(series, first_seq=2, clocks=True)
    text = encode_points(frame)
    assert '"clocks"' in text
    plain = without_clocks(text)
    assert '"clock' not in plain and "NaN" in plain
    parsed = parse_frame(plain)
    assert isinstance(parsed, Points)
    assert all(column.clock is None for column in parsed.series.values())
    loss = parsed.columns()["loss"]
    assert math.isnan(loss.values[3]) and loss.steps == series["loss"].steps
    assert parsed.columns()["accuracy"] == series["accuracy"]
    # Any other frame, and a frame without clocks, go as they are, character for character.
    other = '{"type":"end","v":1,"seq":3,"reason":"completed","time":1.0,"traceback":null}'
    assert without_clocks(other) == other
    [unclocked] = points_frames(series, first_seq=2)
    assert without_clocks(encode_points(unclocked)) == encode_points(unclocked)
