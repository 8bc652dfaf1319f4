"""What the sender pays to turn a second of device-ring rows into points: ``packing.decode``.

Once a second (at each frame, or at once when a look finds something urgent) the callback's
sender thread hands the rows its looks kept to the run as columns: which rows are sick, which
record their per-variable gradient norms, each series' values. This times that decode on a
second of the benchmark MLP's rows (500 steps: the head, six variables' norms, one Keras
metric; random healthy values, a norm every 10 steps), a fresh ``StepVitals`` each call, in a
fresh process per side and round.

``--against REF`` runs the same at git ``REF`` (a temporary worktree, imported ahead of this
checkout) alternated with this checkout, the order swapped each round, and prints this / REF:
each round's ratio, their median and range.

    python benchmarks/hand_over.py [--rounds 7] [--calls 400] [--against REF]
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


def decode_micros(src: str, calls: int) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, str(calls)], env=env_for(src),
                          check=True, capture_output=True)  # fmt: skip
    return float(done.stdout.decode().strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400, help="decodes timed a round and side")
    parser.add_argument("--against", metavar="REF", help="a git commit to compare with")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        sides = sources(args.against, stack)
        took: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            for side in order:
                took[side].append(decode_micros(sides[side], args.calls))
    print(f"packing.decode of a second of a 2 ms MLP's ring rows (500), {args.rounds} rounds "
          f"of {args.calls} calls, a fresh process a side and round "
          "(median µs a call):")  # fmt: skip
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
