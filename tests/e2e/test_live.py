"""WS /api/v1/live: run-list changes for every browser, points for subscribers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
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


def test_malformed_browser_message_closes_with_1007(server: ServerProcess) -> None:
    with connect(server.url.replace("http", "ws") + "/api/v1/live") as browser:
        browser.send("subscribe me")
        try:
            while True:
                browser.recv(timeout=10)
        except ConnectionClosed as exc:
            assert exc.rcvd is not None and exc.rcvd.code == 1007
            assert "subscribe" in exc.rcvd.reason


def test_a_live_client_is_held_to_small_requests_for_real_run_ids(server: ServerProcess) -> None:
    url = server.url.replace("http", "ws") + "/api/v1/live"

    def closed_after(*requests: str | bytes) -> tuple[int, str]:
        with connect(url) as ws, pytest.raises(ConnectionClosed) as closed:
            for request in requests:
                ws.send(request)
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None
        return closed.value.rcvd.code, closed.value.rcvd.reason

    big = json.dumps({"type": "subscribe", "run_id": "r" * 4 * 2**20})
    assert closed_after(big) == (1009, "live requests are at most 1 KiB")
    odd = json.dumps({"type": "subscribe", "run_id": "../x\n"})
    assert closed_after(odd)[0] == 1007
    many = [json.dumps({"type": "subscribe", "run_id": f"r{i}"}) for i in range(257)]
    assert closed_after(*many) == (1008, "at most 256 runs a connection")
    # A binary frame, and a kilobyte of nesting: each its own close code, no traceback (the
    # first raised a KeyError out of the route, the second a RecursionError).
    binary = json.dumps({"type": "subscribe", "run_id": "r1"}).encode()
    assert closed_after(binary) == (1003, "expected JSON text frames, got a binary frame")
    assert closed_after("[" * 1000)[0] == 1007
    with connect(url) as ws:  # the server lives on
        ws.send(json.dumps({"type": "subscribe", "run_id": "r1"}))
    server.stop()
    assert "Traceback" not in server.output(), server.output()[-4000:]
