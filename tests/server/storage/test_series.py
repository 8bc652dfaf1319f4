"""Points in storage: stored once, read in step order with NaN kept, a million read back."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sqlalchemy import delete, select

from tests.server.storage.rows import hello
from trainvitals.exceptions import StorageError
from trainvitals.protocol import ArrayColumns, Columns
from trainvitals.server.storage import RunEnd
from trainvitals.server.storage.codec import CURRENT
from trainvitals.server.storage.schema import chunks, clocks
from trainvitals.server.storage.series import Due
from trainvitals.server.store import Store


def test_replayed_frames_are_stored_once(store: Store) -> None:
    points = {"loss": Columns([1, 2, 3], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0])}
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(work, "r1", 1, points, now=2.0)
    with store.transaction() as work:
        store.series.add_points(work, "r1", 1, points, now=3.0)  # the same frame, replayed
    steps, _, values = store.series.read_series("r1", "loss")
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [3.0, 2.0, 1.0]


def test_many_frames_in_one_transaction_are_stored_once_each(store: Store) -> None:
    """Hundreds of frames committed together (on PostgreSQL: through COPY), a replayed one
    among them, and one stored already: each is stored once, and a rolled-back one not."""
    frame = {f"s{i}": Columns([1], [1.0], [float(i)]) for i in range(10)}
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(work, "r1", 1, frame, now=1.0)
    with store.transaction() as work:
        for seq in range(1, 41):  # 400 chunks, seq 1 stored already
            store.series.add_points(work, "r1", seq, frame, now=2.0)
        store.series.add_points(work, "r1", 40, frame, now=2.0)  # replayed in the same one
    try:
        with store.transaction() as work:
            store.series.add_points(work, "r1", 41, frame, now=3.0)
            raise RuntimeError("the transaction fails")
    except RuntimeError:
        pass
    with store.transaction() as work:
        store.series.add_points(work, "r1", 42, {"s0": Columns([1], [1.0], [0.0])}, now=4.0)
    steps, _, values = store.series.read_series("r1", "s3")
    assert steps.tolist() == [1] * 40 and set(values.tolist()) == {3.0}
    assert store.series.read_series("r1", "s0")[0].tolist() == [1] * 41


def test_series_reads_in_step_order_and_keeps_nan(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(
            work, "r1", 2, {"loss": Columns([3, 4], [3.0, 4.0], [math.nan, math.inf])}, 2.0
        )
        store.series.add_points(
            work, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [1.0, 2.0])}, 2.0
        )
    steps, times, values = store.series.read_series("r1", "loss")
    assert steps.tolist() == [1, 2, 3, 4]
    assert times.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert values[:2].tolist() == [1.0, 2.0] and math.isnan(values[2]) and values[3] == math.inf
    assert store.series.read_series("r1", "missing")[0].size == 0


def test_a_million_points_read_back(store: Store) -> None:
    n, per_frame = 1_000_000, 20_000
    with store.transaction() as work:
        store.runs.open_run(work, hello("big"), now=1.0)
        for seq, start in enumerate(range(0, n, per_frame), start=1):
            steps = np.arange(start, start + per_frame)
            store.series.add_points(
                work, "big", seq, {"loss": Columns(steps, steps * 0.5, np.sqrt(steps))}, 1.0
            )
    steps, times, values = store.series.read_series("big", "loss")
    assert steps.size == n and steps[-1] == n - 1 and times[10] == 5.0 and values[16] == 4.0


def test_recent_points_and_last_readings(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1001.0)
        for seq in range(1, 6):
            store.series.add_points(
                work,
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
    # At most the last `points` of each series, however many the frames hold.
    recent = store.series.recent_points("r1", frames=5, points=3)
    assert {name: list(column.steps) for name, column in recent.items()} == {
        "loss": [3, 4, 5],
        "host/rss": [3, 4, 5],
    }
    assert list(recent["host/rss"].values) == [30.0, 40.0, 50.0]
    assert store.series.last_values("r1", ("host/",)) == {"host/rss": 50.0}


def _frames(store: Store, run_id: str, frames: int, per_frame: int = 32) -> dict[str, ArrayColumns]:
    """``frames`` agent frames of a per-step series, a per-second one and a sparse one; the
    points sent, per series."""
    rng = np.random.default_rng(7)
    sent: dict[str, list[ArrayColumns]] = {}
    with store.transaction() as work:
        store.runs.open_run(work, hello(run_id), now=1.0)
        for seq in range(1, frames + 1):
            steps = np.arange((seq - 1) * per_frame, seq * per_frame)
            times = 1.7e9 + steps * 0.01 + rng.uniform(0, 1e-3, per_frame)
            loss = rng.normal(1, 0.1, per_frame).astype(np.float32).astype(np.float64)
            if seq == 3:
                loss[:3] = [math.nan, math.inf, -0.0]
            points = {
                "loss": Columns(steps, times, loss),
                "host/rss": Columns(steps[-1:], times[-1:], np.array([1e9 + seq])),
            }
            if seq % 4 == 0:
                points["grad/norm/dense/kernel"] = Columns(steps[::10], times[::10], loss[::10])
            store.series.add_points(work, run_id, seq, points, now=2.0)
            for name, columns in points.items():
                sent.setdefault(name, []).append(columns)
    return {
        name: Columns(*(np.concatenate([getattr(c, f) for c in parts]) for f in Columns._fields))
        for name, parts in sent.items()
    }


def _rows(store: Store, run_id: str) -> list[tuple[str, int, int | None, int]]:
    with store.engine.connect() as conn:
        query = select(chunks.c.series, chunks.c.seq, chunks.c.encoding, chunks.c.n).where(
            chunks.c.run_id == run_id
        )
        rows = conn.execute(query.order_by(chunks.c.series, chunks.c.seq))
        return [(name, seq, encoding, n) for name, seq, encoding, n in rows]


def _same(a: ArrayColumns, b: ArrayColumns) -> bool:
    return all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b, strict=True)
    )


def test_an_ended_run_is_compacted_into_blocks_that_read_back_bit_for_bit(store: Store) -> None:
    sent = _frames(store, "r1", frames=300)
    assert store.series.runs_to_compact(live_margin=10, live_after=1000) == []  # live, young
    with store.transaction() as work:
        store.runs.end_run(work, "r1", 301, RunEnd("completed", 3.0, None))
    (due,) = store.series.runs_to_compact(live_margin=10, live_after=1000)
    assert due == Due("r1", 301, True)
    last_before = store.series.last_values("r1", ("host/",))
    assert store.series.compact(due, block_points=4096) == 300 + 300 + 75
    rows = _rows(store, "r1")
    # loss: 9600 points in blocks of at most 4096 keyed by their last frame; host/rss and the
    # sparse norms one block each.
    assert [(s, seq, e, n) for s, seq, e, n in rows if s == "loss"] == [
        ("loss", 128, CURRENT, 4096), ("loss", 256, CURRENT, 4096), ("loss", 300, CURRENT, 1408)
    ]  # fmt: skip
    assert [(s, n) for s, _, _, n in rows if s != "loss"] == [
        ("grad/norm/dense/kernel", 300), ("host/rss", 300)
    ]  # fmt: skip
    for name, columns in sent.items():
        assert _same(store.series.read_series("r1", name), columns), name
        streamed = list(store.series.iter_series("r1", name, batch_rows=2))
        assert _same(Columns(*(np.concatenate(c) for c in zip(*streamed, strict=True))), columns)
    assert store.series.last_values("r1", ("host/",)) == last_before == {"host/rss": 1e9 + 300}
    assert store.series.runs_to_compact(live_margin=10, live_after=1000) == []
    assert store.series.compact(due, block_points=4096) == 0  # nothing left to do


def test_a_live_run_is_compacted_in_full_blocks_behind_its_replayed_history(
    store: Store,
) -> None:
    sent = _frames(store, "live", frames=200)
    (due,) = store.series.runs_to_compact(live_margin=50, live_after=100)
    assert due.through == 150 and not due.ended
    store.series.compact(due, block_points=1024)
    rows = _rows(store, "live")
    loss = [(seq, e, n) for s, seq, e, n in rows if s == "loss"]
    # Frames 1-128 make four full blocks; 129-150 wait for more, and 151-200 stay as sent.
    assert loss[:4] == [(seq, CURRENT, 1024) for seq in (32, 64, 96, 128)]
    assert loss[4:] == [(seq, None, 32) for seq in range(129, 201)]
    assert _same(store.series.read_series("live", "loss"), sent["loss"])
    recent = store.series.recent_points("live", frames=50)
    assert recent["loss"].steps.tolist() == sent["loss"].steps[-50 * 32 :].tolist()
    assert store.series.runs_to_compact(live_margin=50, live_after=100) == []


def _family_frames(
    store: Store, run_id: str, frames: int, first: int = 1
) -> dict[str, list[ArrayColumns]]:
    """Frames of series that share steps and times, and some that nearly do: loss and
    accuracy every step at the same times; step_time at the same steps, one time a ULP off;
    two layer norms every 10 steps; two host series at their own ticks (steps repeat). The
    points sent, per frame."""
    rng = np.random.default_rng(first)
    sent: dict[str, list[ArrayColumns]] = {}
    with store.transaction() as work:
        if first == 1:
            store.runs.open_run(work, hello(run_id), now=1.0)
        for seq in range(first, first + frames):
            steps = np.arange((seq - 1) * 20, seq * 20)
            times = np.round((1.7e9 + steps * 0.01 + rng.uniform(0, 1e-3, 20)) * 1e6) / 1e6
            loss = rng.normal(1, 0.1, 20).astype(np.float32).astype(np.float64)
            loss[seq % 20] = [math.nan, math.inf, -math.inf, -0.0][seq % 4]
            off = times.copy()
            off[seq % 20] = np.nextafter(off[seq % 20], math.inf)
            tick = np.array([steps[0], steps[0]]), np.array([times[0], times[0] + 1.0])
            points = {
                "loss": Columns(steps, times, loss),
                "accuracy": Columns(steps, times, rng.uniform(0, 1, 20)),
                "step_time": Columns(steps, off, rng.uniform(0, 1, 20)),
                "grad/norm/a": Columns(steps[::10], times[::10], loss[::10] * 2),
                "grad/norm/b": Columns(steps[::10], times[::10], -loss[::10]),
                "host/rss": Columns(*tick, np.array([1e9 + seq, 1e9])),
                "host/cpu_percent": Columns(*tick, np.array([math.nan, 12.5])),
            }
            store.series.add_points(work, run_id, seq, points, now=2.0)
            for name, columns in points.items():
                sent.setdefault(name, []).append(columns)
    return sent


def _joined(parts: Sequence[ArrayColumns]) -> ArrayColumns:
    return Columns(*(np.concatenate([getattr(p, f) for p in parts]) for f in Columns._fields))


def _clocks(store: Store, run_id: str) -> tuple[int, set[int], set[int]]:
    """The run's clocks: how many, their ids, and the ids its chunk rows use."""
    with store.engine.connect() as conn:
        ids = conn.execute(select(clocks.c.id).where(clocks.c.run_id == run_id)).scalars().all()
        used = conn.execute(
            select(chunks.c.clock).where(chunks.c.run_id == run_id, chunks.c.clock.is_not(None))
        ).scalars()
        return len(ids), set(ids), set(used)


def test_series_with_the_same_steps_and_times_keep_them_once_and_read_back_bit_for_bit(
    store: Store,
) -> None:
    sent = _family_frames(store, "r1", frames=100)
    with store.transaction() as work:
        store.runs.end_run(work, "r1", 101, RunEnd("completed", 3.0, None))
    assert store.series.compact(Due("r1", 100, True), block_points=512) == 7 * 100
    # Per block of 512 loss points (four, the last 464): one clock for loss and accuracy,
    # one for step_time; one for the two norms and one for the two host series (a block each).
    count, ids, used = _clocks(store, "r1")
    assert count == 4 + 4 + 1 + 1 and ids == used
    for name, parts in sent.items():
        columns = _joined(parts)
        assert _same(store.series.read_series("r1", name), columns), name
        streamed = list(store.series.iter_series("r1", name, batch_rows=1))
        assert _same(_joined(streamed), columns), name
    recent = store.series.recent_points("r1", frames=100)
    assert _same(recent["step_time"], _joined(sent["step_time"]))
    assert store.series.last_values("r1", ("host/",)) == {"host/rss": 1e9, "host/cpu_percent": 12.5}

    # More frames after it ended: the blocks under half full (the norms' and host series')
    # are merged again with them, and the clocks they used go once no block uses them (the
    # first norm's block merged, its clock stays for the second's).
    more = _family_frames(store, "r1", frames=10, first=101)
    (due,) = store.series.runs_to_compact(live_margin=0, live_after=1)
    assert store.series.compact(due, block_points=512) == 7 * 10 + 4
    count, ids, used = _clocks(store, "r1")
    assert count == 5 + 5 + 1 + 1 and ids == used
    for name, parts in sent.items():
        assert _same(store.series.read_series("r1", name), _joined(parts + more[name])), name

    # Thinned: each series' kept points, in blocks of their own, and no clock left unused.
    loss = _joined(sent["loss"] + more["loss"])
    assert store.series.thin("r1", max_points=100, now=5.0) > 0
    thinned = store.series.read_series("r1", "loss")
    keep = np.searchsorted(loss.steps, thinned.steps)
    assert _same(thinned, Columns(loss.steps[keep], loss.times[keep], loss.values[keep]))
    count, ids, used = _clocks(store, "r1")
    assert ids == used and 0 < count <= 7
    with store.transaction() as work:
        assert store.delete_run(work, "r1")
    assert _clocks(store, "r1") == (0, set(), set())


def test_a_block_whose_clock_is_missing_says_so(store: Store) -> None:
    _family_frames(store, "r1", frames=3)
    store.series.compact(Due("r1", 3, True))
    with store.engine.begin() as conn:
        conn.execute(delete(clocks))
    with pytest.raises(StorageError, match="its clock"):
        store.series.read_series("r1", "loss")


_run_numbers = itertools.count()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_any_points_sharing_steps_and_times_or_nearly_read_back_after_compaction(
    store: Store, data: st.DataObject
) -> None:
    """Frames of any steps and any float64 times and values: a series with the first's very
    steps and times, one with a bit of one time flipped, one with a step one off; compacted in
    blocks of any size, each reads back bit for bit, and every clock stored is used."""
    run_id = f"r{next(_run_numbers)}"  # a run of its own for each example, on one store
    frames = data.draw(st.integers(1, 5))
    sent: dict[str, list[ArrayColumns]] = {}
    with store.transaction() as work:
        store.runs.open_run(work, hello(run_id), now=1.0)
        for seq in range(1, frames + 1):
            n = data.draw(st.integers(1, 40))
            steps = data.draw(hnp.arrays(np.int64, n))
            times = data.draw(hnp.arrays(np.uint64, n)).view(np.float64)
            flipped, off = times.copy(), steps.copy()
            at, bit = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 63))
            flipped.view(np.uint64)[at] ^= np.uint64(1) << np.uint64(bit)
            off[at : at + 1] += 1  # wrapping

            def values() -> np.ndarray:  # any float64 bits: NaN payloads, ±0, ±Inf, subnormals
                return data.draw(hnp.arrays(np.uint64, n)).view(np.float64)  # noqa: B023

            points = {
                "a": Columns(steps, times, values()),
                "b": Columns(steps, times, values()),
                "flipped": Columns(steps, flipped, values()),
                "off": Columns(off, times, values()),
            }
            store.series.add_points(work, run_id, seq, points, now=2.0)
            for name, columns in points.items():
                sent.setdefault(name, []).append(columns)
        store.runs.end_run(work, run_id, frames + 1, RunEnd("completed", 3.0, None))
    store.series.compact(Due(run_id, frames, True), block_points=data.draw(st.integers(1, 100)))
    for name, parts in sent.items():
        stored = list(store.series.iter_series(run_id, name))
        assert _same(_joined(stored), _joined(parts)), name
    _, ids, used = _clocks(store, run_id)
    assert ids == used
    assert _clock_ids(store, run_id, "a") == _clock_ids(store, run_id, "b")


def _clock_ids(store: Store, run_id: str, name: str) -> list[int | None]:
    query = select(chunks.c.clock).where(chunks.c.run_id == run_id, chunks.c.series == name)
    with store.engine.connect() as conn:
        return list(conn.execute(query.order_by(chunks.c.seq)).scalars())
