"""Alert-to-notification latency, and what an alert storm becomes, measured in one run.

1. latency: a hand-made agent sends a frame with a NaN loss; the time from just before the
   frame is sent to the arrival of the request at a local HTTP receiver, for a Slack channel
   and a signed webhook channel with the default pace (the budget: 1 s). Trials are spaced
   beyond the channels' grouping window, so each alert is a message of its own;
2. storm: ``--storm`` runs blow up within a second: how many messages each channel gets,
   and how long until the last alert of the storm has been delivered.

    python benchmarks/notify.py [--trials 15] [--storm 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.notify import (
    HOOK_PATH,
    SLACK_PATH,
    Receiver,
    agent,
    nan_loss,
    notifying_server,
    receiving,
)
from harness.polling import wait_for

#: The channels' default grouping window (seconds), plus a margin.
SPACING = 2.2


def latency(tmp: Path, receiver: Receiver, trials: int) -> None:
    server = notifying_server(tmp, receiver)
    delays: dict[str, list[float]] = {SLACK_PATH: [], HOOK_PATH: []}
    try:
        for trial in range(trials):
            with agent(server, f"latency-{trial}") as ws:
                sent = time.time()
                nan_loss(ws)
                for path, found in delays.items():
                    arrived = receiver.wait(path, trial + 1)[trial].time
                    found.append(arrived - sent)
            time.sleep(SPACING)  # past the grouping window: the next alert goes alone
    finally:
        server.stop()
    for path, name in ((SLACK_PATH, "slack"), (HOOK_PATH, "webhook")):
        ms = sorted(1000 * d for d in delays[path])
        print(
            f"alert -> {name} request, {len(ms)} alerts: median {statistics.median(ms):.0f} ms, "
            f"p95 {ms[max(0, round(0.95 * len(ms)) - 1)]:.0f} ms, max {ms[-1]:.0f} ms "
            f"(budget 1000 ms)",
            flush=True,
        )


def storm(tmp: Path, receiver: Receiver, size: int) -> None:
    server = notifying_server(tmp / "storm", receiver)
    connections = []
    try:
        started = time.time()
        for index in range(size):
            ws = agent(server, f"storm-{index}")
            connections.append(ws)
            nan_loss(ws)
        tripped = time.time() - started

        def everything(path: str) -> int | None:
            requests = receiver.at(path, accepted_only=True)
            told = sum(alerts_in(r.json()) for r in requests)
            return len(requests) if told >= size else None

        for path, name in ((SLACK_PATH, "slack"), (HOOK_PATH, "webhook")):
            messages = wait_for(lambda p=path: everything(p), timeout=120, what=name)
            last = max(r.time for r in receiver.at(path, accepted_only=True))
            print(
                f"storm: {size} alerts tripped in {tripped:.2f} s -> {messages} {name} "
                f"messages, the last delivered {last - started:.2f} s after the first alert",
                flush=True,
            )
    finally:
        for ws in connections:
            ws.close()
        server.stop()


def alerts_in(message: dict[str, Any]) -> int:
    """Alerts told by one message: a webhook's items, or a grouped Slack message's count
    ("12 alert changes ...")."""
    if "items" in message:
        return len(message["items"])
    first = message["text"].split()[0]
    return int(first) if first.isdigit() else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--storm", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "storm").mkdir()
        with receiving() as receiver:
            latency(tmp, receiver, args.trials)
        with receiving() as receiver:
            storm(tmp, receiver, args.storm)


if __name__ == "__main__":
    main()
