"""Points in storage: stored once, read in step order with NaN kept, a million read back."""

from __future__ import annotations

import math

import numpy as np

from tests.server.storage.rows import hello
from trainvitals.protocol import Columns
from trainvitals.server.store import Store


def test_replayed_frames_are_stored_once(store: Store) -> None:
    points = {"loss": Columns([1, 2, 3], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0])}
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(conn, "r1", 1, points, now=2.0)
    with store.engine.begin() as conn:
        store.series.add_points(conn, "r1", 1, points, now=3.0)  # the same frame, replayed
    steps, _, values = store.series.read_series("r1", "loss")
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [3.0, 2.0, 1.0]


def test_many_frames_in_one_transaction_are_stored_once_each(store: Store) -> None:
    """Hundreds of frames committed together (on PostgreSQL: through COPY), a replayed one
    among them, and one stored already: each is stored once, and a rolled-back one not."""
    frame = {f"s{i}": Columns([1], [1.0], [float(i)]) for i in range(10)}
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(conn, "r1", 1, frame, now=1.0)
    with store.engine.begin() as conn:
        for seq in range(1, 41):  # 400 chunks, seq 1 stored already
            store.series.add_points(conn, "r1", seq, frame, now=2.0)
        store.series.add_points(conn, "r1", 40, frame, now=2.0)  # replayed in the same one
    try:
        with store.engine.begin() as conn:
            store.series.add_points(conn, "r1", 41, frame, now=3.0)
            raise RuntimeError("the transaction fails")
    except RuntimeError:
        pass
    with store.engine.begin() as conn:
        store.series.add_points(conn, "r1", 42, {"s0": Columns([1], [1.0], [0.0])}, now=4.0)
    steps, _, values = store.series.read_series("r1", "s3")
    assert steps.tolist() == [1] * 40 and set(values.tolist()) == {3.0}
    assert store.series.read_series("r1", "s0")[0].tolist() == [1] * 41


def test_series_reads_in_step_order_and_keeps_nan(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(
            conn, "r1", 2, {"loss": Columns([3, 4], [3.0, 4.0], [math.nan, math.inf])}, 2.0
        )
        store.series.add_points(
            conn, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [1.0, 2.0])}, 2.0
        )
    steps, times, values = store.series.read_series("r1", "loss")
    assert steps.tolist() == [1, 2, 3, 4]
    assert times.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert values[:2].tolist() == [1.0, 2.0] and math.isnan(values[2]) and values[3] == math.inf
    assert store.series.read_series("r1", "missing")[0].size == 0


def test_a_million_points_read_back(store: Store) -> None:
    n, per_frame = 1_000_000, 20_000
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("big"), now=1.0)
        for seq, start in enumerate(range(0, n, per_frame), start=1):
            steps = np.arange(start, start + per_frame)
            store.series.add_points(
                conn, "big", seq, {"loss": Columns(steps, steps * 0.5, np.sqrt(steps))}, 1.0
            )
    steps, times, values = store.series.read_series("big", "loss")
    assert steps.size == n and steps[-1] == n - 1 and times[10] == 5.0 and values[16] == 4.0


def test_recent_points_and_last_readings(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1001.0)
        for seq in range(1, 6):
            store.series.add_points(
                conn,
                "r1",
                seq,
                {
                    "loss": Columns([seq], [1000.0 + seq], [1.0 / seq]),
                    "host/rss": Columns([seq], [1000.0], [seq * 10.0]),
                },
                now=1000.0 + seq,
            )
    recent = store.series.recent_points("r1", frames=2)
    assert list(recent["loss"][0]) == [4, 5]
    assert store.series.last_values("r1", ("host/",)) == {"host/rss": 50.0}
