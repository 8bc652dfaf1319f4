"""CPU per stored frame on the server's writer thread: its kept connection against a
connection taken from the pool for each transaction (what the writer did before: the pool's
ping on checkout and its rollback on return, around every commit), and against the writer
without series summaries (each series' last, least and greatest value, merged into its
``series`` row at each commit, for the runs list's metric columns), alternated in one run.

Each frame is what an agent sends after 40 steps of a small MLP: 7 per-step series and 6
per-variable gradient norms every 10 steps. Frames are submitted one at a time and awaited,
as one agent's are.

    python benchmarks/writer.py [--frames 400] [--rounds 7] [--db PATH_OR_URL]

With ``--db postgresql://.../DATABASE`` it measures PostgreSQL (it creates trainvitals'
tables there: give it a scratch database); ``make bench`` measures SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainvitals.server.storage import series as series_module
from trainvitals.server.storage import unit_of_work
from trainvitals.server.storage.summary import Summary
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer, _Item, _settle

PER_STEP = ["loss", "accuracy", "step_time", "grad/global_norm"]
PER_STEP += ["nonfinite/loss", "nonfinite/grads", "nonfinite/inputs"]
VARIABLES = [
    f"grad/norm/sequential/dense_{i}/{part}" for i in range(3) for part in ("kernel", "bias")
]


class PooledWriter(Writer):
    """The writer as it was: a pool checkout per transaction."""

    def _apply(self, batch: list[_Item]) -> None:
        with self._store.transaction() as work:
            results = [operation(work) for operation, _, _ in batch]
        for (_, future, loop), result in zip(batch, results, strict=True):
            _settle(loop, [(future, result, None)])


class UnsummarisedWriter(Writer):
    """The writer as it was before series summaries: a frame's steps read for their highest
    (the point there too, a little more than before), and nothing merged at the commit."""

    def _apply(self, batch: list[_Item]) -> None:
        def highest(values: Any, top: int, at: int) -> Summary:
            return Summary(top, 0.0, None, None)

        kept = series_module.summary_at, unit_of_work._summary_rows
        series_module.summary_at = highest  # type: ignore[assignment]
        unit_of_work._summary_rows = lambda _: []  # type: ignore[assignment]
        try:
            super()._apply(batch)
        finally:
            series_module.summary_at, unit_of_work._summary_rows = kept


def frame(first: int, steps: int = 40, rng: random.Random | None = None) -> dict[str, Any]:
    """A frame's points, ``{name: (steps, times, values)}``: constant values, or with ``rng``
    values drawn from it at full precision, as a real run's are (what their JSON costs)."""
    step = list(range(first, first + steps))
    at = [1.8e9 + 0.005 * s for s in step]

    def values(count: int, constant: float) -> list[float]:
        return [constant] * count if rng is None else [rng.random() for _ in range(count)]

    points = {name: (step, at, values(steps, 0.5)) for name in PER_STEP}
    for name in VARIABLES:
        points[name] = (step[::10], at[::10], values(len(step[::10]), 0.1))
    return points


async def cpu_per_frame(
    store: Store, writer_class: type[Writer], run_id: str, frames: int
) -> float:
    writer = writer_class(store)
    hello = {"run_id": run_id, "project": "bench", "name": run_id, "config": {}, "host": "h",
             "pid": 1, "started_at": time.time(), "env": {}, "job": None}  # fmt: skip
    try:
        await writer.submit(partial(store.runs.open_run, hello=hello, now=time.time()))
        start = time.process_time()
        for seq in range(1, frames + 1):
            points = frame(1 + 40 * (seq - 1))
            await writer.submit(
                partial(
                    store.series.add_points, run_id=run_id, seq=seq, points=points, now=time.time()
                )
            )
        return (time.process_time() - start) / frames
    finally:
        writer.close()


async def measure(db: str, frames: int, rounds: int) -> None:
    store = Store(db)
    store.create_schema()
    kinds: list[tuple[str, type[Writer]]] = [
        ("kept", Writer), ("pooled", PooledWriter), ("unsummarised", UnsummarisedWriter)
    ]  # fmt: skip
    cpu: dict[str, list[float]] = {name: [] for name, _ in kinds}
    try:
        for r in range(rounds):
            for name, writer_class in kinds if r % 2 else kinds[::-1]:
                cpu[name].append(await cpu_per_frame(store, writer_class, f"{name}-{r}", frames))
    finally:
        store.dispose()
    median = {name: statistics.median(cpu[name]) * 1e3 for name in cpu}
    print(
        f"{store.dialect}: CPU per frame, "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in median.items())
    )
    for other in ("pooled", "unsummarised"):
        ratios = [a / b for a, b in zip(cpu["kept"], cpu[other], strict=True)]
        print(
            f"  this writer / {other}: {statistics.median(ratios):.3f} "
            f"(rounds {min(ratios):.2f} to {max(ratios):.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--db", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure(args.db or str(Path(tmp) / "writer.db"), args.frames, args.rounds))


if __name__ == "__main__":
    main()
