"""What sending shared steps and times once (the ``points`` frame's clocks) saves, side by side.

The frames are a second of what ``VitalsCallback`` sends for a 2 ms MLP: 500 steps of seven
series recorded together (loss, accuracy, learning rate, global gradient norm, the three
NaN/Inf counts), the step time stamped a little later, six variables' gradient norms every 10
steps, six system samples; values random at full precision. Each is packed as the agent packs
it, with and without clocks, and

- the agent's side: packing and encoding one frame (``points_frames`` and ``encode_points``),
  the two in turn, many times;
- the wire: the frame's bytes;
- the server's side: one real ``trainvitals serve`` process on the same cores, each round a
  run of plain frames and a run of frames with clocks in turn (the order swapped each round),
  each frame acknowledged (so stored and judged) before the next; the server's CPU a frame
  from ``/proc``, with each round's ratio (clocks / plain), the median and the spread. Its
  compactor, whose work on the stored points is the same for both forms, is held off.

    python benchmarks/clocks.py [--rounds 7] [--frames 150]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.processes import ServerProcess, cpu_seconds  # noqa: E402
from trainvitals.agent.buffer import encode_points, points_frames  # noqa: E402
from trainvitals.protocol import FEATURE_CLOCKS, Columns, ListColumns  # noqa: E402

STEPS = 500
TOGETHER = ["loss", "accuracy", "lr", "grad/global_norm"]
TOGETHER += ["nonfinite/loss", "nonfinite/inputs", "nonfinite/grads"]
NORMS = [f"grad/norm/sequential/dense{i}/{p}" for i in ("", "_1", "_2") for p in ("kernel", "bias")]
HOST = ["host/rss", "host/available", "host/limit", "host/swap_used", "host/cpu_percent"]
HOST += ["host/disk_free"]


def second(index: int, rng: random.Random) -> dict[str, ListColumns]:
    """The ``index``-th second of the run's points."""
    first = index * STEPS + 1
    steps = list(range(first, first + STEPS))
    start = 1795317434.0 + index
    times = [round(start + 0.002 * (s - first) + rng.random() * 1e-4, 6) for s in steps]
    series: dict[str, ListColumns] = {}
    for name in TOGETHER:
        constant = name == "lr" or name.startswith("nonfinite/")
        values = [0.0 if constant else rng.random() for _ in steps]
        series[name] = Columns(steps, times, [1e-3] * STEPS if name == "lr" else values)
    series["step_time"] = Columns(
        steps, [round(t + 3e-6, 6) for t in times], [0.002 * (1 + rng.random()) for _ in steps]
    )
    every = [s for s in steps if s % 10 == 0]
    every_at = [times[s - first] for s in every]
    for name in NORMS:
        series[name] = Columns(every, every_at, [rng.random() for _ in every])
    for name in HOST:
        series[name] = Columns([steps[-1]], [times[-1]], [rng.random() * 1e9])
    return series


def packed(series: dict[str, ListColumns], seq: int, clocks: bool) -> str:
    [frame] = points_frames(series, seq, clocks)
    return encode_points(frame)


def agent_side(seconds: list[dict[str, ListColumns]], repeats: int) -> tuple[float, float]:
    """Median seconds to pack and encode one frame, plain and with clocks, in turn."""
    took: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(repeats):
        for clocks in (False, True) if repeat % 2 == 0 else (True, False):
            series = seconds[repeat % len(seconds)]
            started = time.perf_counter()
            packed(series, 1, clocks)
            took[clocks].append(time.perf_counter() - started)
    return statistics.median(took[False]), statistics.median(took[True])


def server_side(server: ServerProcess, run_id: str, texts: list[str], settle: float) -> float:
    """The server's CPU a frame, for ``texts`` sent by one run, each acknowledged."""
    hello = {"type": "hello", "v": 1, "run_id": run_id, "project": "bench", "name": run_id,
             "started_at": time.time()}  # fmt: skip
    pid = server.process.pid
    url = server.url.replace("http", "ws") + "/api/v1/ingest"
    with connect(url, max_size=None, compression=None) as ws:  # as the agent: no deflate
        ws.send(json.dumps(hello))
        welcome = json.loads(ws.recv(timeout=30))
        if '"clocks"' in texts[0] and FEATURE_CLOCKS not in welcome.get("features", []):
            raise RuntimeError("this server does not read clocks")
        before = cpu_seconds(pid)
        for text in texts:
            ws.send(text)
            json.loads(ws.recv(timeout=30))
        time.sleep(settle)  # what the frames leave to the server's other tasks, alike for both
        return (cpu_seconds(pid) - before) / len(texts)


def spread(label: str, ratios: list[float]) -> str:
    return (
        f"{label}: {statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]; "
        f"rounds: {' '.join(f'{r:.3f}' for r in ratios)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=150, help="a run, each round and form")
    parser.add_argument("--repeats", type=int, default=400, help="of the agent's packing")
    args = parser.parse_args()
    rng = random.Random(7)
    seconds = [second(i, rng) for i in range(args.frames)]

    plain, clocked = (packed(seconds[0], 1, c) for c in (False, True))
    print(f"a second of a 2 ms MLP's points ({sum(len(c.steps) for c in seconds[0].values())} "
          f"points): {len(plain):,} bytes plain, {len(clocked):,} with clocks "
          f"({len(clocked) / len(plain):.3f}x)")  # fmt: skip

    agent: list[float] = []
    for _ in range(args.rounds):
        a, b = agent_side(seconds, args.repeats)
        agent.append(b / a)
    a, b = agent_side(seconds, args.repeats)
    print(f"the agent packing and encoding it: {a * 1e3:.3f} ms plain, {b * 1e3:.3f} ms clocks")
    print(spread("  with clocks / plain", agent))

    texts = {
        clocks: [packed(s, seq, clocks) for seq, s in enumerate(seconds, start=1)]
        for clocks in (False, True)
    }
    with tempfile.TemporaryDirectory() as tmp:
        # The compactor re-encodes stored points, the same for either form, every 30 s by
        # default: landing in one run's measurement or another's, it would only add noise.
        server = ServerProcess(
            f"sqlite:///{Path(tmp) / 'clocks.db'}",
            extra_env={"TRAINVITALS_COMPACT_INTERVAL": "3600"},
        )
        try:
            server_side(server, "warm", texts[False][:20], 0.5)
            cpu: dict[bool, list[float]] = {False: [], True: []}
            for round_ in range(args.rounds):
                for clocks in (False, True) if round_ % 2 == 0 else (True, False):
                    run_id = f"r{round_}-{'clocks' if clocks else 'plain'}"
                    cpu[clocks].append(server_side(server, run_id, texts[clocks], 1.0))
        finally:
            server.stop()
    ratios = [b / a for a, b in zip(cpu[False], cpu[True], strict=True)]
    print(
        f"the server storing and judging it ({args.frames} frames a run, each acknowledged): "
        f"{statistics.median(cpu[False]) * 1e3:.2f} ms of CPU a frame plain, "
        f"{statistics.median(cpu[True]) * 1e3:.2f} ms with clocks"
    )
    print(spread("  with clocks / plain", ratios))


if __name__ == "__main__":
    main()
