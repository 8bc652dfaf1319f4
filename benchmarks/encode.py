"""Writing a second of points as JSON, orjson against the standard library, alternated in one
run: the agent's ``points`` frame (``agent/buffer.py``'s ``encode_points``, which falls back
on ``json.dumps`` for a frame holding NaN/±Infinity) and the message the server pushes to the
browsers that watch the run (``server/live.py``'s ``Hub.points``).

The second is one of a small model at the agent's default cadence: one frame a second holding
a 2 ms MLP's 500 steps (7 per-step series, 6 per-variable gradient norms every 10 steps).

    python benchmarks/encode.py [--steps 500] [--rounds 21]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.writer import PER_STEP, VARIABLES, frame
from trainvitals.agent.buffer import encode_points, points_frames
from trainvitals.protocol import Columns
from trainvitals.server.live import Hub, finite_or_none


def hub_before(series: dict[str, Any]) -> str:
    """``Hub.points``'s message as it was written before orjson."""
    body = {
        n: {"step": list(s), "time": list(t), "value": finite_or_none(v)}
        for n, (s, t, v) in series.items()
    }
    return json.dumps({"type": "points", "run_id": "r", "series": body})


def hub_now(series: dict[str, Any]) -> Callable[[], str]:
    """A call of the real ``Hub.points`` for a browser that watches the run; returns the
    message the browser gets."""
    hub = Hub()
    browser = hub.subscribe()
    hub.watch(browser, "r")
    columns = {name: Columns(*cols) for name, cols in series.items()}

    def push() -> str:
        hub.points("r", columns)
        return browser.queue.get_nowait()

    return push


def alternated(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds a call of each case, the cases alternated call by call."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, call in cases.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    series = frame(1, args.steps, random.Random(0))  # the writer benchmark's frame
    points = points_frames(series, first_seq=1)[0]
    sick = json.loads(json.dumps(points))
    sick["series"]["loss"]["value"][-1] = float("nan")  # a NaN step: the standard encoder
    assert json.loads(encode_points(points)) == json.loads(json.dumps(points))
    push = hub_now(series)
    assert json.loads(push()) == json.loads(hub_before(series))
    size = len(encode_points(points).encode())
    print(
        f"a second of points: {args.steps} steps of {len(PER_STEP)} series and "
        f"{len(VARIABLES)} norms every 10 steps ({size / 1000:.0f} KB as sent); "
        f"median of {args.rounds} alternated rounds"
    )
    agent = alternated(
        {
            "json": lambda: json.dumps(points),
            "orjson": lambda: encode_points(points),
            "with a NaN": lambda: encode_points(sick),
        },
        args.rounds,
    )
    fast, sick_ms = agent["orjson"], agent["with a NaN"]
    print(
        f"  agent frame: json.dumps {agent['json'] * 1e3:.2f} ms, encode_points "
        f"{fast * 1e3:.2f} ms ({fast / agent['json']:.3f}x); a frame with a NaN "
        f"{sick_ms * 1e3:.2f} ms ({sick_ms / agent['json']:.3f}x)"
    )
    hub = alternated({"json": lambda: hub_before(series), "orjson": push}, args.rounds)
    print(
        f"  live message to browsers: json.dumps {hub['json'] * 1e3:.2f} ms, orjson "
        f"{hub['orjson'] * 1e3:.2f} ms ({hub['orjson'] / hub['json']:.3f}x)"
    )


if __name__ == "__main__":
    main()
