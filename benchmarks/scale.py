"""Many agents against two replicas behind nginx (PostgreSQL, Redis), on this machine.

Simulated agents (asyncio, a few hundred per load process) each open a real websocket
through nginx, say hello, and send one ``points`` frame a second (5 series, 10 steps: 50
points) every ``--interval`` seconds, waiting for each ack. Browsers
connected to each replica directly watch a sample of the runs: a point's ``time`` is when
its agent sent it, so a browser measures agent -> browser latency, across replicas for the
runs whose agent reached the other one.

    python benchmarks/scale.py [--agents 2000] [--interval 5] [--processes 4] [--seconds 30]

Prints points/s, ack latency p50/p99, agent -> browser latency p50/p99 (budget: 250 ms),
and the replicas' memory per agent connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from harness.balancer import Team, redis_url, team
from harness.polling import wait_for
from harness.processes import ServerProcess, cpu_seconds, postgres_database

SERIES = ["loss", "accuracy", "grad/global_norm", "step_time", "host/rss"]
STEPS_PER_FRAME = 10
BUDGET_LIVE_P99_MS = 250.0
#: The replicas take many agents on one token, and many new runs a minute.
LIMITS = {"TRAINVITALS_MAX_CONNECTIONS": "100000", "TRAINVITALS_MAX_RUNS_PER_MINUTE": "100000"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def agent(
    url: str, token: str, run_id: str, start: float, stop: float, interval: float,
    acks: list[float], firsts: list[float],
) -> int:  # fmt: skip
    """One agent's run: hello, then a frame every ``interval`` s until ``stop``; returns the
    points sent. Ack latencies go to ``firsts`` for the run's first frame (which opens its
    series), to ``acks`` for the others."""
    sent = 0
    async with connect(url, additional_headers=bearer(token), compression=None) as ws:
        hello = {"type": "hello", "v": 1, "run_id": run_id, "project": "scale",
                 "name": run_id[:8], "started_at": time.time(), "run_secret": run_id}  # fmt: skip
        await ws.send(json.dumps(hello))
        await ws.recv()
        await asyncio.sleep(max(0.0, start - time.time()))  # every agent connected first
        # Spread over the second, as independent trainings are.
        await asyncio.sleep(interval * (int(run_id[:6], 16) % 1000) / 1000)
        seq = step = 0
        while time.time() < stop:
            seq += 1
            now = time.time()
            steps = list(range(step, step + STEPS_PER_FRAME))
            step += STEPS_PER_FRAME
            column = {"step": steps, "time": [now] * len(steps), "value": [0.5] * len(steps)}
            frame = {"type": "points", "v": 1, "seq": seq,
                     "series": {name: column for name in SERIES}}  # fmt: skip
            await ws.send(json.dumps(frame))
            await ws.recv()
            (acks if seq > 1 else firsts).append(time.time() - now)
            sent += STEPS_PER_FRAME * len(SERIES)
            await asyncio.sleep(max(0.0, now + interval - time.time()))
    return sent


async def agents(
    url: str, token: str, run_ids: list[str], start: float, stop: float, interval: float
) -> tuple[int, list[float], list[float], int]:
    acks: list[float] = []
    firsts: list[float] = []
    results = await asyncio.gather(
        *(agent(url, token, r, start, stop, interval, acks, firsts) for r in run_ids),
        return_exceptions=True,
    )
    failed = sum(isinstance(r, BaseException) for r in results)
    return sum(r for r in results if isinstance(r, int)), acks, firsts, failed


def load_process(
    url: str,
    token: str,
    run_ids: list[str],
    start: float,
    stop: float,
    interval: float,
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    out.put(asyncio.run(agents(url, token, run_ids, start, stop, interval)))


async def browser(
    server: ServerProcess, run_ids: list[str], stop: float, latencies: list[float]
) -> None:
    url = server.url.replace("http", "ws") + "/api/v1/live"
    assert server.token is not None
    async with connect(url, additional_headers=bearer(server.token), max_size=None) as ws:
        for run_id in run_ids:
            await ws.send(json.dumps({"type": "subscribe", "run_id": run_id}))
        while time.time() < stop:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=max(0.01, stop - time.time()))
            except TimeoutError:
                return
            received = time.time()
            message = json.loads(raw)
            if message["type"] == "points":
                sent = message["series"]["loss"]["time"][0]
                latencies.append(received - sent)


async def handover_ms(running: Team, frames: int) -> float:
    """A run streams ``frames`` frames to one replica, then its agent reconnects to the
    other: milliseconds from that hello to the welcome, which the new replica sends once it
    holds the run's lease and has rebuilt its detector from storage."""
    assert running.token is not None
    headers = bearer(running.token)
    run_id = uuid.uuid4().hex
    hello = json.dumps({"type": "hello", "v": 1, "run_id": run_id, "project": "handover",
                        "name": "handover", "started_at": time.time(),
                        "run_secret": run_id})  # fmt: skip
    first, second = (r.url.replace("http", "ws") + "/api/v1/ingest" for r in running.replicas)
    async with connect(first, additional_headers=headers, compression=None) as ws:
        await ws.send(hello)
        await ws.recv()
        for seq in range(1, frames + 1):
            steps = list(range(seq * STEPS_PER_FRAME, (seq + 1) * STEPS_PER_FRAME))
            column = {"step": steps, "time": [1.8e9 + s for s in steps], "value": [0.5] * 10}
            frame = {"type": "points", "v": 1, "seq": seq,
                     "series": {name: column for name in SERIES}}  # fmt: skip
            await ws.send(json.dumps(frame))
            if seq % 50 == 0 or seq == frames:
                while json.loads(await ws.recv())["seq"] < seq:
                    pass
    async with connect(second, additional_headers=headers, compression=None) as ws:
        started = time.perf_counter()
        await ws.send(hello)
        await ws.recv()
        return 1000 * (time.perf_counter() - started)


def pauses(server: ServerProcess) -> dict[tuple[str, str], float]:
    """A replica's pause histograms (``GET /metrics``): (sample name, ``le`` or generation)
    -> value."""
    assert server.token is not None
    request = urllib.request.Request(server.url + "/metrics", headers=bearer(server.token))
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("le", sample.labels.get("generation", ""))): sample.value
        for family in text_string_to_metric_families(text)
        if family.name in ("trainvitals_event_loop_lag_seconds", "trainvitals_gc_pause_seconds")
        for sample in family.samples
    }


def pauses_line(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> str:
    """What a replica's pauses were between two scrapes."""

    def grew(key: tuple[str, str]) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    lag = "trainvitals_event_loop_lag_seconds"
    looks = grew((lag + "_count", ""))
    late = {le: looks - grew((lag + "_bucket", le)) for le in ("0.05", "0.1", "0.25")}
    gc_line = ", ".join(
        f"gen{g} {grew(('trainvitals_gc_pause_seconds_count', str(g))):.0f} "
        f"({1000 * grew(('trainvitals_gc_pause_seconds_sum', str(g))):.0f} ms)"
        for g in range(3)
    )
    return (
        f"event loop late > 50 / 100 / 250 ms: {late['0.05']:.0f} / {late['0.1']:.0f} / "
        f"{late['0.25']:.0f} of {looks:.0f} looks; garbage collections: {gc_line}"
    )


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] if len(values) > 1 else 0.0


def running_runs(running: Team) -> int:
    found = running.replicas[0].get("/api/v1/runs?project=scale&limit=10000")["runs"]
    return len(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4, help="load generator processes")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between frames")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--watched", type=int, default=40, help="runs the browsers watch")
    args = parser.parse_args()
    run_ids = [uuid.uuid4().hex for _ in range(args.agents)]
    with postgres_database() as db, team(db, redis_url(), env=LIMITS) as running:
        url = running.url.replace("http", "ws") + "/api/v1/ingest"
        pids = [replica.process.pid for replica in running.replicas]
        idle = sum(rss_bytes(pid) for pid in pids)
        ramp = max(10.0, args.agents / 100)  # seconds for every agent to connect
        start = time.time() + ramp
        stop = start + args.seconds
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        shares = [run_ids[i :: args.processes] for i in range(args.processes)]
        loaders = [
            multiprocessing.Process(
                target=load_process,
                args=(url, running.token, share, start, stop, args.interval, out),
            )
            for share in shares
        ]
        for loader in loaders:
            loader.start()
        wait_for(
            lambda: running_runs(running) >= args.agents,
            timeout=ramp + 30,
            interval=0.5,
            what=f"{args.agents} agents connected",
        )
        connected = sum(rss_bytes(pid) for pid in pids)
        scraped = [pauses(replica) for replica in running.replicas]
        used = [cpu_seconds(pid) for pid in pids]
        measured_from = time.monotonic()
        latencies: list[float] = []
        watched = run_ids[: args.watched]

        async def browsers() -> None:
            await asyncio.gather(
                *(browser(replica, watched, stop, latencies) for replica in running.replicas)
            )

        asyncio.run(browsers())
        results = [out.get() for _ in loaders]
        for loader in loaders:
            loader.join()
        cores = [
            (cpu_seconds(pid) - before) / (time.monotonic() - measured_from)
            for pid, before in zip(pids, used, strict=True)
        ]
        busy = sum(rss_bytes(pid) for pid in pids)
        paused = [
            pauses_line(before, pauses(replica))
            for before, replica in zip(scraped, running.replicas, strict=True)
        ]
        handovers = [asyncio.run(handover_ms(running, 3000)) for _ in range(3)]
    points = sum(r[0] for r in results)
    acks = [a for r in results for a in r[1]]
    firsts = [a for r in results for a in r[2]]
    failed = sum(r[3] for r in results)
    print(
        f"{args.agents} agents ({args.processes} load processes, asyncio) -> nginx -> 2 "
        f"replicas (PostgreSQL, Redis), {args.seconds:.0f} s, a frame of "
        f"{STEPS_PER_FRAME * len(SERIES)} points per agent every {args.interval:g} s; "
        f"{failed} failed"
    )
    print(
        f"stored and acknowledged: {points / args.seconds:,.0f} points/s, "
        f"{(len(acks) + len(firsts)) / args.seconds:,.0f} frames/s"
    )
    print(
        f"ack latency: p50 {1000 * percentile(acks, 50):.1f} ms, "
        f"p99 {1000 * percentile(acks, 99):.1f} ms ({len(acks)} frames); a run's first "
        f"frame: p50 {1000 * percentile(firsts, 50):.1f} ms, "
        f"p99 {1000 * percentile(firsts, 99):.1f} ms"
    )
    print(
        f"agent -> browser latency ({args.watched} runs watched from each replica, "
        f"{len(latencies)} messages): p50 {1000 * percentile(latencies, 50):.1f} ms, "
        f"p99 {1000 * percentile(latencies, 99):.1f} ms "
        f"= {1000 * percentile(latencies, 99) / BUDGET_LIVE_P99_MS:.2f}x of the 250 ms budget"
    )
    print(
        f"replicas' memory: {idle / 2**20:.0f} MiB idle, {connected / 2**20:.0f} MiB with "
        f"every agent connected, {busy / 2**20:.0f} MiB after the run: "
        f"{(connected - idle) / args.agents / 1024:.0f} KiB per agent connection"
    )
    for index, (line, share) in enumerate(zip(paused, cores, strict=True)):
        print(f"replica {index + 1} while measured: {share:.2f} of a core; {line}")
    print(
        "handover of a run with 3000 frames of history to the other replica (hello -> "
        f"welcome, detector rebuilt): {', '.join(f'{ms:.0f}' for ms in handovers)} ms"
    )


if __name__ == "__main__":
    main()
