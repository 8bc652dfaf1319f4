"""Soak: runs keep arriving for simulated months; the database's size with the retention
policies on and with them off, side by side, on SQLite and PostgreSQL.

Every simulated day ``--runs-per-day`` runs arrive. Each run's frames (``--steps`` steps of
``--series`` series, float32 values and times to the microsecond as the agent sends them, a
jittered 0.1 s apart) go through the Store's write path on the server's writer thread, as the
ingest session writes them; the run ends, and people archive most runs (all but one in
``--keep-every``) three days after they end. Then the server's own
:class:`~trainvitals.server.compactor.Compactor` sweeps with the simulated clock: it deletes
archived runs past their days, thins runs past theirs, and compacts what ended. The same runs
go into two databases of each kind, one with the policies (``thin_after_days`` 7 and
``delete_archived_after_days`` 14 by default), one without (compaction only), day by day in
turn.

What is printed is the size an operator sees: SQLite's file (after a WAL checkpoint; SQLite
reuses freed pages, it does not give them back), and on PostgreSQL every table of the schema
with its indexes and TOAST (``pg_total_relation_size``). A simulated day lasts seconds, in which
autovacuum (60 s naptime) would not wake; a plain ``VACUUM`` after each simulated day stands in
for what it does in a real day (mark dead rows' space reusable; nothing is given back).

    python benchmarks/soak.py [--days 42] [--runs-per-day 4] [--steps 3000] [--series 12]

PostgreSQL: throwaway databases on $TRAINVITALS_TEST_POSTGRES (default
postgresql://postgres@127.0.0.1:5432/postgres), as the tests use; left out when unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.processes import postgres_database
from trainvitals.protocol import ArrayColumns, Columns
from trainvitals.server.compactor import Compactor
from trainvitals.server.live import Hub
from trainvitals.server.settings import Retention
from trainvitals.server.storage import RunEnd, UnitOfWork
from trainvitals.server.storage.run_queries import DAY
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer

#: Steps a frame carries (the agent sends about this many at a 0.1 s step).
FRAME_STEPS = 50
#: Days after its end before a run is archived by its people.
ARCHIVED_AFTER = 3
START = 1.75e9  # the simulated clock's first day (Unix seconds)


@dataclass
class Arrival:
    """A run of the soak: its id, project, start, and points per series."""

    run_id: str
    project: str
    start: float
    series: dict[str, ArrayColumns] = field(default_factory=dict)


def make_run(rng: np.random.Generator, run_id: str, project: str, start: float,
             steps: int, series: int) -> Arrival:  # fmt: skip
    """A run whose series look like a training's: a noisy decaying loss, log-normal gradient
    norms, a creeping RSS and a jumpy CPU percentage, all float32 as the agent sends them."""
    step = np.arange(steps, dtype=np.int64)
    # To the microsecond, as the agent sends them.
    times = np.round((start + np.cumsum(rng.normal(0.1, 0.004, steps))) * 1e6) / 1e6
    arrival = Arrival(run_id, project, start)

    def add(name: str, values: np.ndarray) -> None:
        arrival.series[name] = Columns(step, times, values.astype(np.float32).astype(np.float64))

    add("loss", 2.3 * np.exp(-step / (steps / 4)) + 0.1 + rng.normal(0, 0.03, steps))
    add("grad/global_norm", np.exp(rng.normal(0, 0.3, steps)))
    layers = max(0, series - 4)
    for layer in range(layers):
        add(f"grad/norm/dense_{layer}/kernel", np.exp(rng.normal(-1 - layer / 4, 0.3, steps)))
    add("host/rss", 2e9 + step * 4096.0 + rng.integers(0, 64, steps) * 4096.0)
    add("host/cpu_percent", rng.uniform(80, 100, steps))
    return arrival


def write_run(store: Store, work: UnitOfWork, arrival: Arrival, steps: int) -> None:
    """The run's hello, frames and end, as the ingest session hands them to storage."""
    hello = {"run_id": arrival.run_id, "project": arrival.project, "name": arrival.run_id,
             "config": {"lr": 3e-4}, "host": "node-1", "pid": 1, "started_at": arrival.start,
             "env": {}}  # fmt: skip
    store.runs.open_run(work, hello, now=arrival.start)
    seq = 0
    for first in range(0, steps, FRAME_STEPS):
        seq += 1
        part = slice(first, first + FRAME_STEPS)
        frame = {name: Columns(c.steps[part], c.times[part], c.values[part])
                 for name, c in arrival.series.items()}  # fmt: skip
        now = float(frame["loss"].times[-1])
        store.series.add_points(work, arrival.run_id, seq, frame, now=now)
    ended = float(arrival.series["loss"].times[-1])
    store.runs.end_run(work, arrival.run_id, seq + 1, RunEnd("completed", ended, None))


class Database:
    """One database of the soak, its writer and compactor on the simulated clock."""

    def __init__(self, url: str, path: str | None, retention: bool, args: argparse.Namespace):
        self.store = Store(url)
        self.store.create_schema()
        self.path = path
        self.writer = Writer(self.store)
        self.now = START
        self.compactor = Compactor(
            self.store,
            self.writer,
            Hub(),
            0,
            thin_after=Retention.parse(args.thin_after_days if retention else None),
            delete_archived_after=Retention.parse(
                args.delete_archived_after_days if retention else None
            ),
            thin_points=args.thin_points,
            clock=lambda: self.now,
        )
        self.deleted = 0
        self.seconds = 0.0  # spent writing and sweeping

    async def day(self, now: float, arrivals: list[Arrival], to_archive: list[str],
                  steps: int) -> None:  # fmt: skip
        self.now = now
        started = time.perf_counter()
        for arrival in arrivals:
            await self.writer.submit(partial(write_run, self.store, arrival=arrival, steps=steps))
        for run_id in to_archive:
            edit = partial(self.store.runs.edit_run, run_id=run_id, edit={"archived": True},
                           now=now)  # fmt: skip
            await self.writer.submit(edit)
        self.deleted += len(await self.compactor.delete_archived())
        await asyncio.to_thread(self.compactor.sweep)
        self.seconds += time.perf_counter() - started

    def size(self) -> int:
        """Bytes of the database as an operator sees it (see the module's docstring)."""
        if self.path is not None:
            with contextlib.closing(sqlite3.connect(self.path)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return os.path.getsize(self.path)
        with self.store.engine.connect() as conn:
            # What autovacuum would have done in a day (see the module's docstring).
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM"))
            total = conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = 'public' AND c.relkind = 'r'"
                )
            ).scalar()
        return int(total or 0)

    def runs(self) -> int:
        return len(self.store.runs.list_runs(limit=1_000_000))

    def close(self) -> None:
        self.writer.close()
        self.store.dispose()


@contextlib.contextmanager
def databases(tmp: str, args: argparse.Namespace) -> Iterator[dict[str, Database]]:
    """``{label: database}``: SQLite without and with retention, then PostgreSQL's when it
    is reachable."""
    opened: dict[str, Database] = {}
    with contextlib.ExitStack() as stack:
        for retention in (False, True):
            path = str(Path(tmp) / f"soak-{retention}.db")
            opened[f"SQLite {'retention' if retention else 'none'}"] = Database(
                path, path, retention, args
            )
        try:
            urls = [stack.enter_context(postgres_database()) for _ in range(2)]
        except RuntimeError as exc:
            print(f"PostgreSQL left out: {exc}")
        else:
            for retention, url in zip((False, True), urls, strict=True):
                opened[f"PostgreSQL {'retention' if retention else 'none'}"] = Database(
                    url, None, retention, args
                )
        try:
            yield opened
        finally:
            for database in opened.values():
                database.close()


async def soak(args: argparse.Namespace, tmp: str) -> None:
    rng = np.random.default_rng(7)
    ended_on: dict[int, list[str]] = {}  # day -> runs that ended that day
    points_a_run = args.steps * args.series
    with databases(tmp, args) as opened:
        labels = list(opened)
        print(f"{args.runs_per_day} runs a day, {points_a_run:,} points each "
              f"({args.steps:,} steps x {args.series} series); retention: thin after "
              f"{args.thin_after_days} days to {args.thin_points} points a series, archived "
              f"runs deleted after {args.delete_archived_after_days} days; all but one run in "
              f"{args.keep_every} archived {ARCHIVED_AFTER} days after its end")  # fmt: skip
        header = " ".join(f"{label:>22s}" for label in labels)
        print(f"\n{'day':>4s} {'points in':>11s} {header}   (MB; runs kept)")
        sizes: dict[str, list[float]] = {label: [] for label in labels}
        total = 0
        for day in range(args.days):
            now = START + day * DAY
            arrivals = [
                make_run(rng, f"d{day:03d}r{i}", "soak", now + i * 3600.0,
                         args.steps, args.series)
                for i in range(args.runs_per_day)
            ]  # fmt: skip
            total += len(arrivals) * points_a_run
            ended_on[day] = [a.run_id for a in arrivals]
            due = ended_on.get(day - ARCHIVED_AFTER, [])
            to_archive = [r for i, r in enumerate(due) if i % args.keep_every != 0]
            end_of_day = now + DAY - 1
            for database in opened.values():
                await database.day(end_of_day, arrivals, to_archive, args.steps)
            for label, database in opened.items():
                sizes[label].append(database.size() / 1e6)
            if day % args.every == args.every - 1 or day == args.days - 1:
                cells = " ".join(
                    f"{sizes[label][-1]:15.1f} ({opened[label].runs():3d})" for label in labels
                )
                print(f"{day + 1:4d} {total / 1e6:10.1f}M {cells}")
        third = max(1, args.days // 3)
        print("\ngrowth a day, first third → last third of the soak (MB/day), and the end size "
              "with retention as a fraction of the size without:")  # fmt: skip
        for label in labels:
            series = sizes[label]
            first = (series[third - 1] - series[0]) / max(1, third - 1)
            last = (series[-1] - series[-third]) / max(1, third - 1)
            print(f"  {label:22s} {first:7.2f} → {last:7.2f}   "
                  f"(writes and sweeps: {opened[label].seconds:.0f} s, "
                  f"{opened[label].deleted} runs deleted)")  # fmt: skip
        for kind in ("SQLite", "PostgreSQL"):
            if f"{kind} none" in sizes:
                kept, unkept = sizes[f"{kind} retention"][-1], sizes[f"{kind} none"][-1]
                print(f"  {kind}: {kept:.1f} MB with retention vs {unkept:.1f} MB without: "
                      f"{kept / unkept:.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=42)
    parser.add_argument("--runs-per-day", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--series", type=int, default=12, help="at least 4")
    parser.add_argument("--thin-after-days", default="7")
    parser.add_argument("--delete-archived-after-days", default="14")
    parser.add_argument("--thin-points", type=int, default=500)
    parser.add_argument("--keep-every", type=int, default=4, help="one run in N never archived")
    parser.add_argument("--every", type=int, default=3, help="print every N days")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        asyncio.run(soak(args, tmp))
        print(f"\n{args.days} simulated days in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
