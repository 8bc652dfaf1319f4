"""WS /api/v1/live: run-list changes for every browser, points for subscribers. The close
codes of bad requests are tested in this process: tests/server/test_live_route.py."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.client import connect

from harness.polling import wait_for
from harness.processes import ServerProcess, run_series
from trainvitals import Run, resolve
from trainvitals.protocol import Columns


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


def test_a_page_that_asks_for_clocks_gets_each_clock_once(server: ServerProcess) -> None:
    """Series the agent recorded at the same steps and times come on one clock, as in its
    frame, to a page that connected with ``?clocks=1``; each with its own copy to others."""
    # No system samples, and the first loss stored before the pushes are watched: either
    # could share the first watched frame with lr, on clocks of their own (seen in CI).
    run = Run(resolve(server=server.url, run_name="clocked"), system_metrics=False)
    run.start()
    run.log(1, {"loss": 1.0})
    wait_for(
        lambda: (
            server.get("/api/v1/runs")["runs"]
            and run_series(server, run.id, "loss").get("loss", {}).get("step") == [1]
        ),
        what="the run's first loss to be stored",
    )
    live = server.url.replace("http", "ws") + "/api/v1/live"
    with connect(live + "?clocks=1") as page, connect(live) as script:
        for browser in (page, script):
            browser.send(json.dumps({"type": "subscribe", "run_id": run.id}))
        got: dict[str, list[dict[str, Any]]] = {"page": [], "script": []}
        step = 10

        def both_have_points() -> bool:
            nonlocal step
            steps, times = [step, step + 1], [1.7e9 + step, 1.7e9 + step + 1]
            run.add_columns({"loss": Columns(steps, times, [0.5, float("nan")]),
                             "lr": Columns(steps, times, [0.1, 0.1])})  # fmt: skip
            step += 2
            for name, browser in (("page", page), ("script", script)):
                try:
                    while True:
                        message = json.loads(browser.recv(timeout=0.2))
                        if message["type"] == "points" and "lr" in message["series"]:
                            got[name].append(message)
                except TimeoutError:
                    pass
            return bool(got["page"]) and bool(got["script"])

        wait_for(both_have_points, timeout=20, interval=0)
    clocked, plain = got["page"][0], got["script"][0]
    (key,) = clocked["clocks"]
    assert clocked["series"]["lr"] == {"clock": key, "value": [0.1, 0.1]}
    assert clocked["series"]["loss"] == {"clock": key, "value": [0.5, None]}
    steps = clocked["clocks"][key]["step"]
    assert "clocks" not in plain
    assert plain["series"]["loss"]["step"] == plain["series"]["lr"]["step"] == steps
    assert plain["series"]["loss"]["value"] == [0.5, None]
    assert run.finish()
