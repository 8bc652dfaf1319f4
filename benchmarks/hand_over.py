"""What the sender pays to turn a second of device-ring rows into points: ``packing.decode``.

Once a second (at each frame, or at once when a look finds something urgent) the callback's
sender thread hands the rows its looks kept to the run as columns: which rows are sick, which
record their per-variable gradient norms, each series' values. This times that decode on a
second of the benchmark MLP's rows (500 steps: the head, six variables' norms, one Keras
metric; random healthy values, a norm every 10 steps), a fresh ``StepVitals`` each call, in a
fresh process per side and round.

``--whole`` times the sender's whole way instead, in CPU seconds a second of points: the
second's rows decoded at five looks of 100 rows (``read_interval`` 0.2 s) and handed to the
point buffer with their step times (``PointBuffer.add_columns``), a system sample of eight
series (``add``), then the buffer drained into a frame with clocks and encoded
(``points_frames``, ``encode_points``), as for a server that reads them; ``--buffer`` the
point buffer's part of it alone (``add_columns``, ``add``, ``drain``, ``points_frames``).

``--against REF`` runs the same at git ``REF`` (a temporary worktree, imported ahead of this
checkout) alternated with this checkout, the order swapped each round, and prints this / REF:
each round's ratio, their median and range.

    python benchmarks/hand_over.py [--rounds 7] [--calls 400] [--whole | --buffer] [--against REF]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cli_startup import env_for, sources

#: Run in each side's own process: prints the median microseconds of one decode.
CHILD = """
import statistics, sys, time
import numpy as np
from trainvitals.agent import packing
from trainvitals.agent.vitals import StepVitals
from trainvitals.series import GRAD_GLOBAL_NORM, LOSS, LOSS_SCALE, LR

calls = int(sys.argv[1])
names = tuple(f"sequential/dense{i}/{p}" for i in ("", "_1", "_2") for p in ("kernel", "bias"))
measured = packing.Measured(loss=True, inputs=True, grads=True, names=names, lr=True,
                            metrics=("accuracy",))
rows = 500
rng = np.random.default_rng(0)
block = np.zeros((rows, len(packing.HEAD) + len(names) + 1))
at = packing.HEAD.index
block[:, at(LOSS)] = rng.random(rows)  # the NaN/Inf counts stay 0
block[:, at(GRAD_GLOBAL_NORM)] = rng.random(rows) + 1.0
block[:, at(LR)] = 1e-3
block[:, at(LOSS_SCALE)] = np.nan  # no loss scale
block[:, len(packing.HEAD):] = rng.random((rows, len(names) + 1))
steps = list(range(1, rows + 1))
times = [1795317434.0 + 0.002 * s for s in steps]
took = []
for _ in range(calls):
    vitals = StepVitals(10)
    started = time.perf_counter()
    packing.decode(block, steps, times, measured, vitals)
    took.append(time.perf_counter() - started)
print(statistics.median(took) * 1e6)
"""

#: Run in each side's own process: prints the CPU microseconds of the sender's whole way for
#: a second of points (decode, buffer, frame, encode), over ``calls`` seconds; with a second
#: argument, of the buffer's part alone (``add_columns``, ``add``, ``drain``, ``points_frames``).
WHOLE = (
    CHILD.rsplit("took = []", 1)[0]
    + """
from trainvitals.agent.buffer import PointBuffer, encode_points, points_frames
host = [f"host/{n}" for n in ("rss", "available", "limit", "swap_used", "cpu_percent",
                               "disk_free", "working_set", "rss_anon")]
looks = [(block[i:i + 100], steps[i:i + 100], times[i:i + 100]) for i in range(0, rows, 100)]
vitals = StepVitals(10)
buffer = PointBuffer()
clock = time.process_time
whole, buffered = 0.0, 0.0
for second in range(calls):
    started = clock()
    shift = second * rows
    for part, at_steps, at_times in looks:
        at_steps = [s + shift for s in at_steps]
        at_times = [t + shift * 0.002 for t in at_times]
        columns = packing.decode(part, at_steps, at_times, measured, vitals).columns
        columns["step_time"] = packing.step_time_columns(
            [(s, 0.002, t + 3e-6) for s, t in zip(at_steps, at_times)])
        handing = clock()
        buffer.add_columns(columns)
        buffered += clock() - handing
    handing = clock()
    buffer.add(buffer.last_step, at_times[-1], {name: 1e9 + second for name in host})
    frames = points_frames(buffer.drain(), 1, True)
    buffered += clock() - handing
    for frame in frames:
        encode_points(frame)
    whole += clock() - started
print((buffered if len(sys.argv) > 2 else whole) / calls * 1e6)
"""
)


def decode_micros(src: str, calls: int, child: str = CHILD, *args: str) -> float:
    done = subprocess.run([sys.executable, "-c", child, str(calls), *args], env=env_for(src),
                          check=True, capture_output=True)  # fmt: skip
    return float(done.stdout.decode().strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400, help="decodes timed a round and side")
    parser.add_argument("--whole", action="store_true", help="decode, buffer, frame, encode")
    parser.add_argument("--buffer", action="store_true", help="of --whole, the buffer's part")
    parser.add_argument("--against", metavar="REF", help="a git commit to compare with")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        sides = sources(args.against, stack)
        child = WHOLE if args.whole or args.buffer else CHILD
        extra = ["buffer"] if args.buffer else []
        took: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            for side in order:
                took[side].append(decode_micros(sides[side], args.calls, child, *extra))
    what = "packing.decode"
    if args.whole or args.buffer:
        what = "the sender's way (CPU) from ring rows to frame text"
        what += ": the buffer's part" if args.buffer else ""
    print(f"{what} for a second of a 2 ms MLP's ring rows (500), {args.rounds} rounds "
          f"of {args.calls} calls, a fresh process a side and round "
          "(µs a second of points):")  # fmt: skip
    for side, values in took.items():
        print(f"  {side}: {statistics.median(values):.0f} µs; rounds: "
              + " ".join(f"{v:.0f}" for v in values))  # fmt: skip
    if "ref" in took:
        ratios = [a / b for a, b in zip(took["this"], took["ref"], strict=True)]
        print(f"  this / {args.against}: {statistics.median(ratios):.3f}x "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]; rounds: "
              + " ".join(f"{r:.3f}" for r in ratios))  # fmt: skip


if __name__ == "__main__":
    main()
