"""What one hostile client costs everyone else (#15), measured side by side in one run.

For each attack, on loopback against ``trainvitals serve``: the p99 of ``GET /healthz`` and of
an honest run's ack latency (a points frame sent, its ack read) while the attack runs, as a
ratio to the same measured with no attack just before; and the honest run's points lost.

Attacks, each bounded in count and time:
  fuzz      one client sending malformed frames on fresh connections, as fast as it can
  bodies    one client posting 60 MiB bodies to the silence route
  requests  the control for bodies: one client sending small GETs on fresh connections as fast
            as it can (bodies are refused from the Content-Length before being read, so the
            bodies attack is a connection flood of this kind; its ratio should not exceed this)
  silent    500 connections that never say hello
  readers   50 live subscribers that never read, while the honest run streams
  churn     one client's hello/end/points churn on a run of its own (the rebuild attack)

The budget (docs/security.md) is about one client: no attack may raise /healthz p99 above
twice its idle value or cost the honest run a point. The attacker runs on the same cores as
the server, so part of any ratio is the attacker's own CPU.

    python benchmarks/abuse.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from harness.processes import ServerProcess


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


class Honest:
    """A run that streams one points frame at a time and times each ack."""

    def __init__(self, url: str) -> None:
        self.ws = connect(url + "/api/v1/ingest", compression=None)  # as the agent connects
        self.ws.send(json.dumps({"type": "hello", "v": 1, "run_id": "honest", "project": "h",
                                 "name": "honest", "started_at": time.time(),
                                 "run_secret": "honest"}))  # fmt: skip
        self.seq = int(json.loads(self.ws.recv(timeout=10))["last_seq"])
        self.sent = 0

    def one(self) -> float:
        self.seq += 1
        self.sent += 1
        frame = {"type": "points", "v": 1, "seq": self.seq,
                 "series": {"loss": {"step": [self.seq], "time": [time.time()],
                                     "value": [1.0 / self.seq]}}}  # fmt: skip
        started = time.perf_counter()
        self.ws.send(json.dumps(frame))
        while json.loads(self.ws.recv(timeout=30)).get("seq") != self.seq:
            pass
        return time.perf_counter() - started


def measure(server: ServerProcess, honest: Honest, seconds: float) -> tuple[float, float]:
    """p99 of /healthz and of the honest ack, sampled alternately for ``seconds``."""
    health: list[float] = []
    acks: list[float] = []
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(health) < 5000:
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        health.append(time.perf_counter() - started)
        acks.append(honest.one())
    connection.close()
    return p99(health), p99(acks)


@contextlib.contextmanager
def running(work: Callable[[threading.Event], None], threads: int) -> Iterator[None]:
    stop = threading.Event()
    workers = [threading.Thread(target=work, args=(stop,), daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)


def fuzz(url: str) -> Callable[[threading.Event], None]:
    def work(stop: threading.Event) -> None:
        rng = random.Random(threading.get_ident())
        while not stop.is_set():
            with contextlib.suppress(OSError, ConnectionClosed, InvalidStatus, TimeoutError):
                with connect(url + "/api/v1/ingest", open_timeout=5) as ws:
                    junk = rng.choice(
                        [
                            '{"type":"hello","v":1,"started_at":NaN}',
                            "[]",
                            "{",
                            '{"type":"points","v":1,"seq":1,"series":{}}',
                        ]
                    )
                    ws.send(junk)
                    ws.recv(timeout=5)

    return work


def bodies(server: ServerProcess) -> Callable[[threading.Event], None]:
    body = b"{" + b" " * (60 * 2**20) + b"}"

    def work(stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                connection.request("POST", "/api/v1/alerts/x/silence", body,
                                   {"Content-Type": "application/json"})  # fmt: skip
                connection.getresponse().read()
                connection.close()

    return work


def requests(server: ServerProcess) -> Callable[[threading.Event], None]:
    def work(stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                connection.request("GET", "/api/v1/alerts/x")
                connection.getresponse().read()
                connection.close()

    return work


def churn(url: str) -> Callable[[threading.Event], None]:
    def work(stop: threading.Event) -> None:
        run_id = f"churn{threading.get_ident()}"
        seq = 0
        while not stop.is_set():
            with contextlib.suppress(OSError, ConnectionClosed, InvalidStatus, TimeoutError):
                with connect(url + "/api/v1/ingest", open_timeout=5) as ws:
                    ws.send(json.dumps({"type": "hello", "v": 1, "run_id": run_id,
                                        "project": "c", "name": "churn", "started_at": 1.0,
                                        "run_secret": "c"}))  # fmt: skip
                    seq = max(seq, int(json.loads(ws.recv(timeout=5))["last_seq"]))
                    for kind in ("end", "points"):
                        seq += 1
                        frame = ({"type": "end", "v": 1, "seq": seq, "reason": "completed",
                                  "time": time.time()} if kind == "end" else
                                 {"type": "points", "v": 1, "seq": seq, "series": {"loss": {
                                     "step": [seq], "time": [1.0], "value": [1.0]}}})  # fmt: skip
                        ws.send(json.dumps(frame))
                        ws.recv(timeout=5)

    return work


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--only", action="append", help="run only these attacks (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "abuse.db"))
        url = server.url.replace("http", "ws")
        honest = Honest(url)
        silent: list[ClientConnection] = []
        try:
            print(f"{'attack':<10}{'healthz p99':>14}{'ratio':>8}{'ack p99':>12}{'ratio':>8}")
            attacks: list[tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = [
                ("fuzz", lambda: running(fuzz(url), 1)),
                ("bodies", lambda: running(bodies(server), 1)),
                ("requests", lambda: running(requests(server), 1)),
                ("churn", lambda: running(churn(url), 1)),
                ("silent", lambda: running(lambda stop: stop.wait(), 1)),
                ("readers", lambda: running(lambda stop: stop.wait(), 1)),
            ]
            for name, attack in attacks:
                if args.only and name not in args.only:
                    continue
                base_health, base_ack = measure(server, honest, args.seconds)
                if name == "silent":
                    silent = [
                        connect(url + "/api/v1/ingest", ping_interval=None) for _ in range(500)
                    ]
                if name == "readers":
                    silent = [
                        # Never read, so a close can't complete its handshake: don't wait.
                        connect(
                            url + "/api/v1/live", max_queue=1, ping_interval=None, close_timeout=0.1
                        )
                        for _ in range(50)
                    ]
                    for ws in silent:
                        ws.send(json.dumps({"type": "subscribe", "run_id": "honest"}))
                with attack():
                    health, ack = measure(server, honest, args.seconds)
                for ws in silent:
                    with contextlib.suppress(Exception):
                        ws.close()
                silent = []
                print(f"{name:<10}{health * 1e3:>11.2f} ms{health / base_health:>7.2f}x"
                      f"{ack * 1e3:>9.2f} ms{ack / base_ack:>7.2f}x")  # fmt: skip
            stored = server.get("/api/v1/runs/honest/series?name=loss&max_points=100000")
            count = stored["series"]["loss"]["count"]
            print(f"honest points sent {honest.sent}, stored {count}, lost {honest.sent - count}")
        finally:
            honest.ws.close()
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
