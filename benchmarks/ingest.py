"""Points per second ingested by one server process from N concurrent agents, into SQLite
and PostgreSQL side by side, then by two replicas behind nginx (PostgreSQL and Redis).

Each agent is a real websocket connection speaking the agent protocol (hello, then numbered
``points`` frames, acknowledged by the server after commit), with up to WINDOW frames in
flight, as the agent's sender does after an outage. The load generator runs in its own
process so the server process has one core to itself on a 2-core machine (the replicas,
nginx and PostgreSQL share the same two cores: their aggregate is a lower bound).

    python benchmarks/ingest.py [--agents 1 10 200] [--seconds 6] [--no-replicas]

Prints points/s against the budgets (500k on SQLite, 300k on PostgreSQL), and then how long
the series route takes to open a 1M-point series (budget: under 1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.asyncio.client import ClientConnection, connect

from harness.balancer import redis_url, team
from harness.processes import ServerProcess, postgres_database

BUDGET_POINTS_PER_S = 500_000
BUDGET_POSTGRES_POINTS_PER_S = 300_000
SERIES = ["loss", "accuracy", "grad/global_norm", "step_time", "host/rss"]
STEPS_PER_FRAME = 200  # 5 series x 200 steps = 1000 points a frame
WINDOW = 8


@functools.lru_cache(maxsize=2048)  # agents that keep pace share their frames' text
def frame_body(first_step: int) -> str:
    steps = list(range(first_step, first_step + STEPS_PER_FRAME))
    times = [1.8e9 + s * 0.01 for s in steps]
    return json.dumps(
        {
            name: {"step": steps, "time": times, "value": [1.0 / (s + 1) for s in steps]}
            for name in SERIES
        }
    )


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def say_hello(ws: ClientConnection, run_id: str, name: str) -> None:
    """Open the run as an agent does: ``hello``, then wait for ``welcome``."""
    hello = {
        "type": "hello",
        "v": 1,
        "run_id": run_id,
        "project": "bench",
        "name": name,
        "started_at": time.time(),
        "run_secret": f"secret-{run_id}",
    }
    await ws.send(json.dumps(hello))
    await ws.recv()


async def agent(url: str, deadline: float, counts: list[int], token: str | None) -> None:
    run_id = uuid.uuid4().hex
    points_per_frame = STEPS_PER_FRAME * len(SERIES)
    headers = bearer(token)
    async with connect(url, max_size=None, compression=None, additional_headers=headers) as ws:
        await say_hello(ws, run_id, run_id[:8])
        seq = acked = 0
        while time.monotonic() < deadline:
            while seq - acked < WINDOW:
                seq += 1
                # Steps go on from frame to frame, as a training's do, so that the alert rules
                # judge a healthy run (a stream that went back in time would trip them).
                body = frame_body((seq - 1) * STEPS_PER_FRAME)
                await ws.send(f'{{"type":"points","v":1,"seq":{seq},"series":{body}}}')
            acked = json.loads(await ws.recv())["seq"]
            counts[0] += points_per_frame
        while acked < seq:
            acked = json.loads(await ws.recv())["seq"]


async def load(url: str, agents: int, seconds: float, token: str | None) -> tuple[int, float]:
    counts = [0]
    start = time.monotonic()
    await asyncio.gather(*(agent(url, start + seconds, counts, token) for _ in range(agents)))
    return counts[0], time.monotonic() - start


def load_process(
    url: str,
    agents: int,
    seconds: float,
    token: str | None,
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    out.put(asyncio.run(load(url, agents, seconds, token)))


def measure(url: str, agents: int, seconds: float, token: str | None = None) -> float:
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    arguments = (url, agents, seconds, token, out)
    process = multiprocessing.Process(target=load_process, args=arguments)
    process.start()
    points, elapsed = out.get()
    process.join()
    return points / elapsed


def series_open_ms(server: ServerProcess, run_id: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with urllib.request.urlopen(
            f"{server.url}/api/v1/runs/{run_id}/series?name=loss&max_points=2000"
        ) as response:
            response.read()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def one_million(url: str) -> str:
    run_id = uuid.uuid4().hex
    async with connect(url, max_size=None, compression=None) as ws:
        await say_hello(ws, run_id, "1M")
        per_frame = 5_000
        for seq, start in enumerate(range(0, 1_000_000, per_frame), start=1):
            steps = list(range(start, start + per_frame))
            await ws.send(
                json.dumps(
                    {
                        "type": "points",
                        "v": 1,
                        "seq": seq,
                        "series": {
                            "loss": {
                                "step": steps,
                                "time": [1.8e9 + s for s in steps],
                                "value": [1.0 / (s + 1) for s in steps],
                            }
                        },
                    }
                )
            )
            await ws.recv()
    return run_id


def one_process(db: str, agents: list[int], seconds: float) -> list[float]:
    """Points/s into ``db`` by one server process, for each number of agents."""
    server = ServerProcess(db)
    try:
        url = server.url.replace("http", "ws") + "/api/v1/ingest"
        return [measure(url, count, seconds) for count in agents]
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 10, 200])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--no-replicas", action="store_true", help="skip the two replicas")
    args = parser.parse_args()
    print(
        f"ingest by one server process, {len(SERIES) * STEPS_PER_FRAME} points a frame, "
        f"{WINDOW} frames in flight per agent, every alert rule judging"
    )
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as postgres:
        sqlite = one_process(str(Path(tmp) / "bench.db"), args.agents, args.seconds)
        postgresql = one_process(postgres, args.agents, args.seconds)
    print(f"{'agents':>7} {'SQLite':>12} {'vs 500k':>8} {'PostgreSQL':>12} {'vs 300k':>8}")
    for count, lite, pg in zip(args.agents, sqlite, postgresql, strict=True):
        print(
            f"{count:>7} {lite:>12,.0f} {lite / BUDGET_POINTS_PER_S:>7.2f}x "
            f"{pg:>12,.0f} {pg / BUDGET_POSTGRES_POINTS_PER_S:>7.2f}x",
            flush=True,
        )
    if not args.no_replicas:
        with postgres_database() as postgres, team(postgres, redis_url()) as running:
            url = running.url.replace("http", "ws") + "/api/v1/ingest"
            print("two replicas behind nginx, PostgreSQL and Redis (--broker), all on 2 cores")
            for count in args.agents:
                rate = measure(url, count, args.seconds, running.token)
                print(f"{count:>7} {rate:>12,.0f} points/s in all", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "bench.db"))
        try:
            url = server.url.replace("http", "ws") + "/api/v1/ingest"
            run_id = asyncio.run(one_million(url))
            ms = series_open_ms(server, run_id)
        finally:
            server.stop()
    print(
        f"open a 1M-point series (max_points=2000): {ms:.0f} ms median "
        f"= {ms / 1000:.2f}x of the 1 s budget"
    )


if __name__ == "__main__":
    main()
