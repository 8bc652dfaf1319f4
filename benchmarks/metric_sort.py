"""What a page of the runs list costs the server when it is sorted by a series' statistic (a
metric column's heading: ``sort=min:val_loss``) and carries metric columns, against the same
page sorted by start time without them, side by side in one run.

``--runs`` runs of ``--series`` series each are stored through the Store's write path (their
summaries kept as the writer keeps them), then ``find_runs`` is timed in alternated rounds: the
first page of 50 newest first, and the first page sorted by ``min:loss`` with ``loss`` and
``val_loss`` as columns. Prints each side's median time and the ratio of the medians, with
the rounds' range.

    python benchmarks/metric_sort.py [--runs 10000] [--series 12] [--rounds 9] [--db URL]

With ``--db postgresql://.../DATABASE`` it measures PostgreSQL (give it a scratch database);
``make bench`` measures SQLite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainvitals.protocol import Columns
from trainvitals.server.storage import RunFilter
from trainvitals.server.store import Store

CALLS = 20  # find_runs calls a round, a side


def seed(store: Store, runs: int, series: int) -> None:
    names = ["loss", "val_loss", *(f"grad/norm/dense_{i}/kernel" for i in range(series - 2))]
    steps = list(range(1, 41))
    times = [1.7e9 + s for s in steps]
    with store.transaction() as work:
        for r in range(runs):
            hello = {"run_id": f"r{r:06d}", "project": "bench", "name": f"run-{r}",
                     "config": {"lr": 0.001 * (1 + r % 7)}, "host": "h", "pid": 1,
                     "started_at": 1.7e9 + r, "env": {}}  # fmt: skip
            store.runs.open_run(work, hello, now=1.7e9 + r)
            points = {
                name: Columns(steps, times, [1.0 / (s + r % 97 + k) for s in steps])
                for k, name in enumerate(names)
            }
            store.series.add_points(work, f"r{r:06d}", 1, points, now=1.7e9 + r)


def timed(store: Store, which: RunFilter, metrics: tuple[str, ...]) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        page = store.runs.find_runs(which, 50, 0, ("lr",), metrics)
        assert len(page["runs"]) == 50
    return (time.perf_counter() - start) / CALLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--series", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--db", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.db or str(Path(tmp) / "runs.db"))
        store.create_schema()
        try:
            seed(store, args.runs, args.series)
            sides = {
                "by start": (RunFilter(), ()),
                "by min:loss, 2 metric columns": (
                    RunFilter(sort="min:loss", descending=False),
                    ("loss", "val_loss"),
                ),
            }
            times: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(args.rounds):
                for name in sides if r % 2 else list(sides)[::-1]:
                    times[name].append(timed(store, *sides[name]))
        finally:
            store.dispose()
    base, metric = (times[name] for name in sides)
    ratios = [m / b for m, b in zip(metric, base, strict=True)]
    print(
        f"{store.dialect}, {args.runs} runs of {args.series} series, a page of 50: "
        + ", ".join(f"{name} {statistics.median(t) * 1e3:.2f} ms" for name, t in times.items())
        + f"; ratio {statistics.median(metric) / statistics.median(base):.2f}"
        f" (rounds {min(ratios):.2f} to {max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
