"""What judging costs the server: one run's ``Detector`` fed a Keras run's frames.

The frames are what the agent sends for a small CNN: every 0.2 s, 23 steps of the loss,
accuracy, global gradient norm, step time, learning rate and NaN/Inf counts, the gradient
norms of its 10 variables at every step (the device ring records them all), and a system
sample a second. Prints microseconds per frame and per step.

With ``--against DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/before
HEAD~1``), each round times this code and that one in fresh processes, in turn, and prints
each round's ratio (this / that), the median and the spread.

    python benchmarks/detector.py [--frames 2000] [--rounds 5] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainvitals.protocol import Columns, SeqColumns

ROOT = Path(__file__).resolve().parent.parent
STEPS_PER_FRAME = 23
LAYERS = [f"grad/norm/conv2d_{i}/{part}" for i in range(4) for part in ("kernel", "bias")]
LAYERS += ["grad/norm/dense/kernel", "grad/norm/dense/bias"]


def frames(count: int, seed: int = 7) -> list[dict[str, SeqColumns]]:
    """``count`` frames of a healthy run, 0.2 s apart."""
    rng = random.Random(seed)
    out: list[dict[str, SeqColumns]] = []
    step, now = 0, 1.8e9
    for _ in range(count):
        steps = list(range(step + 1, step + STEPS_PER_FRAME + 1))
        times = [now + 0.0087 * i for i in range(1, STEPS_PER_FRAME + 1)]
        loss = [2.3 * math.exp(-s / 3000) * (1 + 0.1 * rng.gauss(0, 1)) for s in steps]
        frame: dict[str, SeqColumns] = {
            "loss": Columns(steps, times, loss),
            "accuracy": Columns(steps, times, [1 - v / 2.3 for v in loss]),
            "grad/global_norm": Columns(steps, times, [rng.lognormvariate(0, 0.2) for _ in steps]),
            "step_time": Columns(steps, times, [0.0087 * (1 + 0.05 * rng.random()) for _ in steps]),
            "lr": Columns(steps, times, [1e-3] * STEPS_PER_FRAME),
            "nonfinite/loss": Columns(steps, times, [0.0] * STEPS_PER_FRAME),
            "nonfinite/inputs": Columns(steps, times, [0.0] * STEPS_PER_FRAME),
            "nonfinite/grads": Columns(steps, times, [0.0] * STEPS_PER_FRAME),
        }
        for depth, name in enumerate(LAYERS):
            scale = 0.05 * (depth + 1)
            frame[name] = Columns(steps, times, [scale * rng.lognormvariate(0, 0.2) for _ in steps])
        if int(now) != int(now + 0.2):  # a system sample a second
            last, at = [steps[-1]], [times[-1]]
            frame["host/rss"] = Columns(last, at, [2e9 + 1e5 * step / 1000])
            frame["host/limit"] = Columns(last, at, [16e9])
            frame["gpu0/temp"] = Columns(last, at, [70.0])
        out.append(frame)
        step, now = step + STEPS_PER_FRAME, now + 0.2
    return out


def time_feed(count: int) -> float:
    """Seconds to judge ``count`` frames after as many again warmed the detector up."""
    from trainvitals.detect.engine import Detector

    stream = [as_ingest_holds_it(frame) for frame in frames(2 * count)]
    warm, timed = stream[:count], stream[count:]
    detector = Detector()
    for frame in warm:
        detector.feed(frame)
    started = time.perf_counter()
    for frame in timed:
        findings = detector.feed(frame)
        assert not findings, findings  # a healthy run: nothing to say
    return time.perf_counter() - started


def as_ingest_holds_it(frame: dict[str, SeqColumns]) -> Mapping[str, SeqColumns]:
    """``frame`` with the clocks the agent sends (the series recorded at one block's steps and
    times share them), as ingest hands it to storage and the detector; a plain dict to code
    from before ``protocol.ClockedSeries``, which found them again by the lists' identity."""
    try:
        from trainvitals.protocol import Clock, ClockedSeries
    except ImportError:
        return frame
    clocks: list[Clock[Sequence[int], Sequence[float]]] = []
    index: dict[tuple[int, int], int] = {}
    series: dict[str, tuple[int, Sequence[float]]] = {}
    for name, (steps, times, values) in frame.items():
        at = index.setdefault((id(steps), id(times)), len(clocks))
        if at == len(clocks):
            clocks.append(Clock(steps, times))
        series[name] = (at, values)
    return ClockedSeries(clocks, series)


def measure(source: Path, count: int) -> float:
    """Seconds per frame, judged by the code under ``source`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(source / "src")}
    command = [sys.executable, __file__, "--worker", str(count)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr)
    return float(done.stdout.split()[-1]) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(time_feed(args.worker))
        return
    results: dict[str, Any] = {"this": [], "that": []}
    for index in range(args.rounds):
        order = [("this", ROOT), ("that", args.against)] if args.against else [("this", ROOT)]
        for label, source in order if index % 2 == 0 else order[::-1]:
            results[label].append(measure(source, args.frames))
    mine = results["this"]
    print(
        f"{args.frames} frames of {STEPS_PER_FRAME} steps ({len(LAYERS)} variables' norms a "
        f"step): {statistics.median(mine) * 1e6:.0f} µs a frame, "
        f"{statistics.median(mine) / STEPS_PER_FRAME * 1e6:.1f} µs a step (median of "
        f"{args.rounds})"
    )
    if args.against:
        theirs = results["that"]
        ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
        print(
            f"{args.against}: {statistics.median(theirs) * 1e6:.0f} µs a frame; this / that "
            f"per round: {', '.join(f'{r:.3f}' for r in ratios)}; median "
            f"{statistics.median(ratios):.3f}x (spread {min(ratios):.3f}-{max(ratios):.3f})"
        )
    print(json.dumps({k: v for k, v in results.items() if v}))


if __name__ == "__main__":
    main()
