"""WS /api/v1/live: run-list changes for every browser, points for subscribers. The close
codes of bad requests are tested in this process: tests/server/test_live_route.py."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.client import connect

from harness.polling import wait_for
from harness.processes import ServerProcess
from trainvitals import Run, resolve


def test_subscribed_browser_receives_points_and_run_updates(server: ServerProcess) -> None:
    run = Run(resolve(server=server.url, run_name="live"))
    run.start()
    run.log(1, {"loss": 1.0})
    wait_for(lambda: server.get("/api/v1/runs")["runs"], what="the run to exist")

    with connect(server.url.replace("http", "ws") + "/api/v1/live") as browser:
        browser.send(json.dumps({"type": "subscribe", "run_id": run.id}))
        received: list[dict[str, Any]] = []
        steps: list[int] = []
        # Log a point at a time until the subscription is in place and points flow.

        def points_arrived() -> bool:
            run.log(len(steps) + 100, {"loss": float("nan")})
            try:
                while True:
                    message = json.loads(browser.recv(timeout=0.2))
                    received.append(message)
                    if message["type"] == "points":
                        assert message["run_id"] == run.id
                        steps.extend(message["series"]["loss"]["step"])
                        assert message["series"]["loss"]["value"][-1] is None  # NaN -> null
            except TimeoutError:
                pass
            return len(steps) >= 3

        wait_for(points_arrived, timeout=20, interval=0)
        assert steps == sorted(steps)
        assert run.finish()

        def finished_pushed() -> bool:
            message = json.loads(browser.recv(timeout=5))
            return message["type"] == "runs" and any(
                r["id"] == run.id and r["status"] == "finished" for r in message["runs"]
            )

        wait_for(finished_pushed, timeout=20, interval=0)
