"""The history a server replays into a run's detector when it takes the run over (another
replica died, or the server restarted): all of the last ``REPLAY_FRAMES`` frames, against
those frames with each series cut to its last ``REPLAY_POINTS`` points, alternated in one run.

The run is one that steps fast at the agent's default cadence: one frame a second, each with
a second of steps of a 2.2 ms MLP (450 steps: 7 per-step series, 6 per-variable gradient
norms every 10 steps, the host readings once). Timed: the stored frames read and decoded,
then fed to a fresh detector, as ``AlertEngine._rebuild`` does before the run is judged again.

    python benchmarks/replay.py [--frames 600] [--steps-per-frame 450] [--rounds 3]

A rebuild reads at most ``REPLAY_FRAMES`` (600) frames: more stored change nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.writer import PER_STEP, VARIABLES
from tests.server.storage.rows import hello
from trainvitals.detect.engine import Detector
from trainvitals.protocol import Columns
from trainvitals.server.alerts import REPLAY_FRAMES, REPLAY_POINTS
from trainvitals.server.store import Store

STEP_SECONDS = 0.0022


def store_run(store: Store, frames: int, per_frame: int) -> None:
    rng = np.random.default_rng(0)
    with store.transaction() as work:
        store.runs.open_run(work, hello("fast"), now=1.8e9)
        for seq in range(1, frames + 1):
            steps = list(range((seq - 1) * per_frame + 1, seq * per_frame + 1))
            times = [1.8e9 + step * STEP_SECONDS for step in steps]
            series = {}
            for name in PER_STEP:
                zero = name.startswith("nonfinite/")
                values = [0.0] * per_frame if zero else (1 + 0.1 * rng.random(per_frame)).tolist()
                series[name] = Columns(steps, times, values)
            for name in VARIABLES:
                every = steps[::10]
                series[name] = Columns(every, times[::10], (1 + rng.random(len(every))).tolist())
            series["host/rss"] = Columns([steps[-1]], [times[-1]], [2e9 + seq * 1e5])
            series["host/limit"] = Columns([steps[-1]], [times[-1]], [16e9])
            store.series.add_points(work, "fast", seq, series, now=times[-1])


def replay(store: Store, points: int | None) -> tuple[float, int]:
    """Seconds to read and feed the history; the points of its longest series."""
    started = time.perf_counter()
    history = store.series.recent_points("fast", REPLAY_FRAMES, points)
    columns = {n: Columns(s.tolist(), t.tolist(), v.tolist()) for n, (s, t, v) in history.items()}
    Detector().feed(columns)  # as AlertEngine._rebuild feeds it
    return time.perf_counter() - started, max(len(column.steps) for column in history.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--steps-per-frame", type=int, default=450)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = Store(str(Path(scratch) / "replay.db"))
        store.create_schema()
        store_run(store, args.frames, args.steps_per_frame)
        whole: list[float] = []
        cut: list[float] = []
        longest: dict[int | None, int] = {}
        for round_ in range(args.rounds):
            order = (None, REPLAY_POINTS) if round_ % 2 == 0 else (REPLAY_POINTS, None)
            for points in order:
                seconds, longest[points] = replay(store, points)
                (whole if points is None else cut).append(seconds)
        store.dispose()
    print(
        f"{args.frames} frames of {args.steps_per_frame} steps: the whole history "
        f"({longest[None]:,} points a series) {statistics.median(whole):.2f} s, each series "
        f"cut to its last {REPLAY_POINTS:,} ({longest[REPLAY_POINTS]:,}) "
        f"{statistics.median(cut):.2f} s: {statistics.median(whole) / statistics.median(cut):.0f}x "
        f"faster (median of {args.rounds} alternated rounds)"
    )


if __name__ == "__main__":
    main()
