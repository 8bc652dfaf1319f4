"""The alert engine in this process: an agent's frames in, alerts out (stored and read through
the API, told to the agent that takes them), run endings, lost runs, per-project rules, and a
restart that takes the stored alerts up rather than raising them again.

tests/e2e/test_alerts.py keeps what needs real agents and browsers (the live push, the
training's log line, a loop of fits leaking memory).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketTestSession

from harness.inprocess import HELLO, in_process, ingest, points, reply, send
from harness.polling import wait_for
from trainvitals.server.settings import Settings

pytestmark = pytest.mark.timeout(120)

ACCEPTING = {**HELLO, "accepts": ["alerts"]}
OOM = "Traceback (most recent call last):\n  ...\nResourceExhaustedError: OOM when allocating"


def alerts_of(client: TestClient, run_id: str, rule: str | None = None) -> list[dict[str, Any]]:
    answer = client.get(f"/api/v1/runs/{run_id}/alerts")
    assert answer.status_code == 200, answer.text
    return [a for a in answer.json()["alerts"] if rule is None or a["rule"] == rule]


def healthy(seq: int, steps: range) -> dict[str, object]:
    loss = [1.0 / s for s in steps]
    return points(
        seq, {"loss": (list(steps), loss), "nonfinite/inputs": (list(steps), [0.0] * len(steps))}
    )


def poisoned(seq: int, steps: range, inputs: float = 4.0) -> dict[str, object]:
    """NaN losses from ``steps``' first, whose batch held ``inputs`` non-finite values."""
    counts = [inputs if s == steps[0] else 0.0 for s in steps]
    return points(
        seq,
        {"loss": (list(steps), [math.nan] * len(steps)), "nonfinite/inputs": (list(steps), counts)},
    )


def told(ws: WebSocketTestSession, frame: dict[str, object]) -> list[dict[str, Any]]:
    """Send ``frame``; what the agent hears until its ack (alerts come from a task of their
    own, before or after it)."""
    send(ws, frame)
    heard: list[dict[str, Any]] = []
    while not heard or heard[-1]["type"] != "ack":
        heard.append(json.loads(ws.receive_text()))
    return heard


def test_a_nan_batch_raises_one_alert_the_agent_hears_and_the_autopsy_names(
    tmp_path: Path,
) -> None:
    with in_process(Settings(db=str(tmp_path / "tv.db"))) as client, ingest(client) as ws:
        reply(ws, ACCEPTING)
        assert told(ws, healthy(1, range(1, 50))) == [{"type": "ack", "seq": 1}]
        heard = told(ws, poisoned(2, range(50, 60)))
        if len(heard) == 1:  # the alert was not sent yet
            heard.insert(0, json.loads(ws.receive_text()))
        alert_frame = next(m for m in heard if m["type"] == "alert")["alert"]
        (alert,) = alerts_of(client, "r1")
        assert (alert["rule"], alert["severity"], alert["state"], alert["step"]) == (
            "nonfinite", "critical", "firing", 50)  # fmt: skip
        assert alert["evidence"]["origin"] == "inputs"
        assert alert["evidence"]["counts"]["inputs"] == 4
        assert (alert_frame["id"], alert_frame["rule"]) == (alert["id"], "nonfinite")
        # A second NaN frame: the same alert, not another.
        told(ws, poisoned(3, range(60, 62)))
        assert len(alerts_of(client, "r1")) == 1
        autopsy = {"type": "autopsy", "v": 1, "seq": 4, "time": 2.0, "step": 50,
                   "report": {"cause": "inputs", "verdict": "the batch held NaN"}}  # fmt: skip
        assert told(ws, autopsy)[-1] == {"type": "ack", "seq": 4}
        (alert,) = alerts_of(client, "r1")
        assert alert["evidence"]["autopsy"]["cause"] == "inputs"
        assert alert["message"] == "NaN/Inf at step 50: the batch held NaN"
        told(ws, healthy(5, range(62, 200)))  # clean steps resolve it
        (resolved,) = alerts_of(client, "r1")
        assert resolved["id"] == alert["id"] and resolved["state"] == "resolved"


def test_an_agent_that_does_not_take_alerts_hears_only_acks(tmp_path: Path) -> None:
    with in_process(Settings(db=str(tmp_path / "tv.db"))) as client, ingest(client) as ws:
        reply(ws, HELLO)
        for seq, loss in enumerate([math.nan, 1.0, 2.0], start=1):
            frame = points(seq, {"loss": ([seq], [loss])})
            assert reply(ws, frame) == {"type": "ack", "seq": seq}
        assert alerts_of(client, "r1", "nonfinite")[0]["state"] == "firing"


def test_a_crashed_run_gets_a_crash_alert_and_its_other_alerts_close(tmp_path: Path) -> None:
    with in_process(Settings(db=str(tmp_path / "tv.db"))) as client, ingest(client) as ws:
        reply(ws, HELLO)
        reply(ws, healthy(1, range(1, 20)))
        reply(ws, poisoned(2, range(20, 21)))
        end = {"type": "end", "v": 1, "seq": 3, "reason": "exception", "time": 100.0,
               "traceback": OOM}  # fmt: skip
        assert reply(ws, end) == {"type": "ack", "seq": 3}
        (crash,) = alerts_of(client, "r1", "crash")
        assert (crash["state"], crash["severity"]) == ("firing", "critical")
        assert "ResourceExhaustedError" in crash["message"] and "smaller batch" in crash["hint"]
        (nonfinite,) = alerts_of(client, "r1", "nonfinite")  # closed, not resolved
        assert (nonfinite["state"], nonfinite["closed_reason"]) == ("closed", "run ended")
        assert nonfinite["closed_time"] == 100.0 and nonfinite["resolved_time"] is None
        health = {"worst": "critical", "rules": ["crash", "nonfinite"], "firing": ["crash"]}
        assert client.get("/api/v1/runs/r1").json()["health"] == health


def test_a_silent_run_is_lost_with_a_crash_alert_that_resolves_when_it_returns(
    tmp_path: Path,
) -> None:
    hello = {**HELLO, "run_secret": "s"}
    with in_process(Settings(db=str(tmp_path / "tv.db"), lost_after=0.5)) as client:
        with ingest(client) as ws:
            reply(ws, hello)
        # The connection closed without an ending and nothing more is heard.
        (crash,) = wait_for(lambda: alerts_of(client, "r1", "crash"), what="the lost run")
        assert crash["evidence"]["end_reason"] == "heartbeat_lost"
        with ingest(client) as ws:  # it was only a network cut
            reply(ws, hello)
            wait_for(
                lambda: alerts_of(client, "r1", "crash")[0]["state"] == "resolved",
                what="the crash alert to resolve",
            )


def test_after_a_restart_firing_alerts_are_taken_up_not_repeated(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "tv.db"))
    hello = {**HELLO, "run_secret": "s"}
    with in_process(settings) as client, ingest(client) as ws:
        reply(ws, hello)
        reply(ws, healthy(1, range(1, 40)))
        reply(ws, poisoned(2, range(40, 41), inputs=2.0))
        (first,) = alerts_of(client, "r1", "nonfinite")
    with in_process(settings) as client, ingest(client) as ws:  # the same database
        assert reply(ws, hello)["last_seq"] == 2
        reply(ws, poisoned(3, range(41, 42), inputs=0.0))
        reply(ws, healthy(4, range(42, 160)))
        (again,) = alerts_of(client, "r1", "nonfinite")
    assert again["id"] == first["id"] and again["state"] == "resolved"


def test_the_rules_file_sets_thresholds_per_project(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("[projects.quiet.nonfinite]\nenabled = false\n[oom_forecast]\nhorizon = 60\n")
    settings = Settings(db=str(tmp_path / "tv.db"), rules=str(rules))
    with in_process(settings) as client:
        assert client.get("/api/v1/rules").json()["rules"]["oom_forecast"]["horizon"] == 60
        quiet = client.get("/api/v1/rules", params={"project": "quiet"}).json()
        assert quiet["rules"]["nonfinite"]["enabled"] is False
        for run_id, project in (("q", "quiet"), ("l", "default")):
            with ingest(client) as ws:
                reply(ws, {**HELLO, "run_id": run_id, "project": project})
                reply(ws, points(1, {"loss": ([1], [math.nan])}))
        assert alerts_of(client, "q") == []
        assert [a["rule"] for a in alerts_of(client, "l")] == ["nonfinite"]


def test_people_acknowledge_and_silence_an_alert_and_the_engine_keeps_their_marks(
    tmp_path: Path,
) -> None:
    with in_process(Settings(db=str(tmp_path / "tv.db"))) as client, ingest(client) as ws:
        reply(ws, HELLO)
        reply(ws, healthy(1, range(1, 50)))
        reply(ws, poisoned(2, range(50, 51)))
        (alert,) = alerts_of(client, "r1")
        acked = client.post(f"/api/v1/alerts/{alert['id']}/ack", json={"by": "ana"})
        assert acked.status_code == 200 and acked.json()["acknowledged_by"] == "ana"
        silenced = client.post(f"/api/v1/alerts/{alert['id']}/silence", json={"duration_s": 600})
        assert silenced.status_code == 200
        body = silenced.json()
        assert body["silence"]["rule"] == "nonfinite"
        assert body["alert"]["silenced_until"] == body["silence"]["until"]
        assert client.post("/api/v1/alerts/nope/ack").status_code == 404
        negative = client.post(f"/api/v1/alerts/{alert['id']}/silence", json={"duration_s": -1})
        assert negative.status_code == 422
        reply(ws, healthy(3, range(51, 160)))  # clean steps resolve it
        (resolved,) = alerts_of(client, "r1")
        assert resolved["state"] == "resolved"
        # People's marks survive the engine's own updates of the alert.
        assert resolved["acknowledged_by"] == "ana"
        assert resolved["silenced_until"] == body["silence"]["until"]
