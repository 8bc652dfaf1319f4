"""Bytes a stored point takes, before and after compaction, on SQLite and PostgreSQL; and the
codec's encode and decode time for a million points.

1. A real demo run (``trainvitals demo``: the Keras CNN on scikit-learn digits, every vital on)
   streams to a real server on a SQLite file with the compactor off. Its rows are copied as
   they are into a fresh PostgreSQL database.
2. On each: the points' payload bytes per point for the loss, the gradient norms and the
   system series, and the database's size (SQLite: the file after ``VACUUM``; PostgreSQL:
   ``pg_total_relation_size`` of ``chunks`` and ``clocks`` after ``VACUUM FULL``), before and
   after the compactor merges the ended run. A shared clock's bytes (steps and times kept once
   for the series that have the same) are shared out among the blocks that use it, so the
   kinds add up to the whole; beside them, the same blocks each with steps and times of its
   own (as before the shared clocks), and in the first codec's wide forms.
3. A million points like the run's loss, encoded in 65,536-point blocks and decoded in one
   call (median of 5).
4. ``read_series`` of a 1M-point series as the writer stores it and once compacted, on each.

    python benchmarks/storage.py [--epochs 30]

PostgreSQL: a throwaway database on $TRAINVITALS_TEST_POSTGRES (default
postgresql://postgres@127.0.0.1:5432/postgres), as the tests use.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import numpy as np
from sqlalchemy import func, insert, select, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.processes import ServerProcess, demo_command, postgres_database
from trainvitals.server.storage import codec
from trainvitals.server.storage.schema import chunks, clocks, metadata
from trainvitals.server.storage.series import BLOCK_POINTS
from trainvitals.server.store import Store

KINDS: dict[str, Callable[[str], bool]] = {
    "loss": lambda n: n == "loss",
    "gradient norms": lambda n: n.startswith("grad/"),
    "system (host/*, gpu*)": lambda n: n.startswith(("host/", "gpu")),
    "every series": lambda n: True,
}


def payload(store: Store) -> tuple[dict[str, tuple[int, float, int]], int]:
    """{kind: (points, payload bytes, rows)}, and the clocks' rows. A row's payload: its
    steps, times and values, and with a shared clock its 8-byte id and its share of the
    clock's steps and times (split evenly among the rows that use it)."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(
                chunks.c.series,
                chunks.c.n,
                func.length(chunks.c.steps)
                + func.length(chunks.c.times)
                + func.length(chunks.c.vals),
                chunks.c.clock,
            )
        ).all()
        shared = dict(
            conn.execute(
                select(clocks.c.id, func.length(clocks.c.steps) + func.length(clocks.c.times))
            ).all()
        )
    users = Counter(r[3] for r in rows if r[3] is not None)

    def size(row: Sequence[object]) -> float:
        own = float(cast(int, row[2]))
        return own if row[3] is None else own + 8 + shared[row[3]] / users[row[3]]

    out = {}
    for kind, wanted in KINDS.items():
        mine = [r for r in rows if wanted(r[0])]
        out[kind] = (sum(int(r[1]) for r in mine), sum(size(r) for r in mine), len(mine))
    return out, len(shared)


def database_bytes(store: Store, path: str | None) -> int:
    if path is not None:
        with sqlite3.connect(path) as conn:
            conn.execute("VACUUM")  # into the WAL: the file shrinks at the checkpoint
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return os.path.getsize(path)
    with store.engine.connect() as conn:
        autocommit = conn.execution_options(isolation_level="AUTOCOMMIT")
        autocommit.execute(text("VACUUM FULL chunks"))
        autocommit.execute(text("VACUUM FULL clocks"))
        query = "SELECT pg_total_relation_size('chunks') + pg_total_relation_size('clocks')"
        return int(conn.execute(text(query)).scalar() or 0)


def own_payload(store: Store, narrow: bool) -> dict[str, int]:
    """{kind: payload bytes} of the same points in blocks each with its own steps and times
    (what the compactor wrote before the shared clocks, encoding 2), or also in the wide forms
    only (``narrow=False``: what the first codec, encoding 1, stored, give or take a byte a
    column), side by side."""
    run = store.runs.get_run(store.runs.list_runs()[0]["id"])
    assert run is not None
    sizes = {}
    for name in run["series"]:
        steps, times, values = store.series.read_series(run["id"], name)
        sizes[name] = sum(
            len(part)
            for i in range(0, steps.size, BLOCK_POINTS)
            for part in codec.encode(*(c[i : i + BLOCK_POINTS] for c in (steps, times, values)),
                                     narrow=narrow)
        )  # fmt: skip
    return {kind: sum(b for n, b in sizes.items() if wanted(n)) for kind, wanted in KINDS.items()}


def measure(store: Store, path: str | None, name: str) -> None:
    (before, _), size_before = payload(store), database_bytes(store, path)
    started = time.perf_counter()
    merged = sum(store.series.compact(due) for due in store.series.runs_to_compact(0, 1))
    took = time.perf_counter() - started
    (after, clock_rows), size_after = payload(store), database_bytes(store, path)
    own, wide = own_payload(store, narrow=True), own_payload(store, narrow=False)
    what = (
        "file after VACUUM" if path else "chunks and clocks tables and indexes, after VACUUM FULL"
    )
    print(f"\n{name}: compacted {merged} rows in {took:.2f} s, into blocks and {clock_rows} "
          "shared clocks")  # fmt: skip
    print(f"  {'series':24s} {'points':>8s} {'rows':>11s} {'payload B/pt':>16s} "
          f"{'own steps, times':>17s} {'wide forms only':>16s}")  # fmt: skip
    for kind in KINDS:
        (points, bytes_before, rows_before), (_, bytes_after, rows_after) = (
            before[kind],
            after[kind],
        )
        print(f"  {kind:24s} {points:8d} {rows_before:5d}->{rows_after:<5d} "
              f"{bytes_before / points:7.2f}->{bytes_after / points:<6.2f} "
              f"{own[kind] / points:17.2f} {wide[kind] / points:16.2f}")  # fmt: skip
    points = before["every series"][0]
    print(f"  database ({what}): {size_before:,} -> {size_after:,} bytes, "
          f"{size_before / points:.1f} -> {size_after / points:.1f} B/pt")  # fmt: skip


def copy_rows(source: Store, target: Store) -> None:
    with source.engine.connect() as read, target.engine.begin() as write:
        for table in metadata.sorted_tables:
            rows = [dict(r) for r in read.execute(select(table)).mappings()]
            if rows:
                write.execute(insert(table), rows)


def codec_timing(store: Store) -> None:
    """A million points like the demo's loss, without repeating it (a repeated stretch would
    deflate to nothing): float32 values of a decaying curve plus noise of the loss's own
    step-to-step scale, steps one apart, times with the run's step intervals drawn at random
    (whole microseconds)."""
    run_id = store.runs.list_runs()[0]["id"]
    _, times, values = store.series.read_series(run_id, "loss")
    rng = np.random.default_rng(20)
    n = 1_000_000
    all_steps = np.arange(1, n + 1, dtype=np.int64)
    # To the microsecond, as the agent sends them.
    all_times = np.round((times[0] + np.cumsum(rng.choice(np.diff(times), n))) * 1e6) / 1e6
    noise = float(np.std(np.diff(values))) / np.sqrt(2)
    curve = values[-1] + (values[0] - values[-1]) * np.exp(-all_steps / (n / 5))
    all_values = (curve + rng.normal(0, noise, n)).astype(np.float32).astype(np.float64)
    starts = range(0, n, BLOCK_POINTS)

    def block(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        part = slice(i, i + BLOCK_POINTS)
        return all_steps[part], all_times[part], all_values[part]

    encode_s = []
    for _ in range(5):
        started = time.perf_counter()
        rows = [(codec.CURRENT, block(i)[0].size, *codec.encode(*block(i))) for i in starts]
        encode_s.append(time.perf_counter() - started)
    # The same points in the wide forms only (the first codec's), and packed as written.
    wide = [(codec.CURRENT, block(i)[0].size, *codec.encode(*block(i), narrow=False))
            for i in starts]  # fmt: skip
    packed = [(None, 0, *codec.encode_raw(*block(i))) for i in starts]
    kinds: dict[str, Sequence[codec.Row]] = {"narrow": rows, "wide": wide, "packed": packed}
    decode_s: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(5):  # interleaved, so that the machine's load falls on each alike
        for kind, these in kinds.items():
            started = time.perf_counter()
            got = codec.decode(these)
            decode_s[kind].append(time.perf_counter() - started)
            assert got.values.tobytes() == all_values.tobytes()

    def size(these: Sequence[codec.Row], first: int = 2) -> float:
        return sum(len(cast(bytes, part)) for row in these for part in row[first:]) / n

    took = {kind: statistics.median(times) * 1e3 for kind, times in decode_s.items()}
    print(f"\ncodec, {n:,} points like the demo's loss, in {len(rows)} blocks: "
          f"{size(rows):.2f} B/pt, values alone {size(rows, 4):.2f} (what a series whose run "
          f"keeps its steps and times in a shared clock stores; wide forms only "
          f"{size(wide):.2f}); "
          f"encode {statistics.median(encode_s) * 1e3:.0f} ms, decode {took['narrow']:.0f} ms "
          f"(wide forms {took['wide']:.0f} ms, packed layout {took['packed']:.0f} ms)")  # fmt: skip


def read_timing(url: str, name: str) -> None:
    """``read_series`` of a 1M-point series (5,000 frames of 200 points), as stored by the
    writer and once compacted; median of 5."""
    from trainvitals.protocol import Columns
    from trainvitals.server.storage.series import Due

    store = Store(url)
    store.create_schema()
    rng = np.random.default_rng(3)
    with store.transaction() as work:
        hello = {"run_id": "m", "project": "p", "name": "m", "config": {}, "host": "h",
                 "pid": 1, "started_at": 1.0, "env": {}}  # fmt: skip
        store.runs.open_run(work, hello, 1.0)
        for seq in range(1, 5001):
            steps = np.arange((seq - 1) * 200, seq * 200)
            values = rng.normal(1, 0.1, 200).astype(np.float32).astype(np.float64)
            columns = Columns(steps, 1.7e9 + steps * 0.01, values)
            store.series.add_points(work, "m", seq, {"loss": columns}, 1.0)

    def median_read() -> float:
        took = []
        for _ in range(5):
            started = time.perf_counter()
            assert store.series.read_series("m", "loss").steps.size == 1_000_000
            took.append(time.perf_counter() - started)
        return statistics.median(took)

    raw = median_read()
    store.series.compact(Due("m", 5000, True))
    compacted = median_read()
    print(f"\n{name}: read a 1M-point series: as written {raw * 1e3:.0f} ms, "
          f"compacted {compacted * 1e3:.0f} ms")  # fmt: skip
    store.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "demo.db")
        server = ServerProcess(path, extra_env={"TRAINVITALS_COMPACT_INTERVAL": "0"})
        try:
            started = time.perf_counter()
            subprocess.run(
                demo_command(server, "storage-bench", "--epochs", str(args.epochs), "--pace", "0"),
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800,
            )  # fmt: skip
            print(f"demo run: {args.epochs} epochs in {time.perf_counter() - started:.0f} s")
        finally:
            server.stop()
        sqlite_store = Store(path)
        with postgres_database() as url:
            pg_store = Store(url)
            pg_store.create_schema()
            copy_rows(sqlite_store, pg_store)
            measure(pg_store, None, "PostgreSQL")
            pg_store.dispose()
        measure(sqlite_store, path, "SQLite")
        codec_timing(sqlite_store)
        sqlite_store.dispose()
        read_timing(str(Path(tmp) / "read.db"), "SQLite")
        with postgres_database() as url:
            read_timing(url, "PostgreSQL")


if __name__ == "__main__":
    main()
