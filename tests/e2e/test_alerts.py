"""The alert engine inside a real server: from a real agent's points to stored alerts, the
API, the live push, acknowledgement and silences, run endings. Frames in and alerts out (lost
runs, restarts, per-project rules, what an agent hears) are tested in this process:
tests/server/test_alert_engine.py."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from harness.polling import wait_for
from harness.processes import ServerProcess
from trainvitals import Run, resolve

ALERT_CONTRACT_FIELDS = {
    "id", "run_id", "rule", "severity", "state", "message", "hint", "step", "time",
    "resolved_time", "evidence",
}  # fmt: skip


def alerts_of(server: ServerProcess, run_id: str, rule: str | None = None) -> list[dict[str, Any]]:
    alerts = server.get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
    return [a for a in alerts if rule is None or a["rule"] == rule]


def healthy_steps(run: Run, steps: range) -> None:
    for step in steps:
        run.log(step, {"loss": 1.0 / step, "nonfinite/inputs": 0.0, "nonfinite/loss": 0.0})


def test_a_nan_batch_raises_one_alert_that_people_can_acknowledge_and_silence(
    server: ServerProcess,
) -> None:
    run = Run(resolve(server=server.url, run_name="nan"), system_metrics=False, watchdog=False)
    run.start()
    with connect(server.url.replace("http", "ws") + "/api/v1/live") as browser:
        healthy_steps(run, range(1, 50))
        for step in range(50, 60):  # the bad batch, then NaN everywhere for a while
            run.log(
                step,
                {
                    "loss": math.nan,
                    "nonfinite/inputs": 4.0 if step == 50 else 0.0,
                    "nonfinite/loss": 1.0,
                },
            )
        wait_for(lambda: alerts_of(server, run.id, "nonfinite"), what="the nonfinite alert")
        (alert,) = alerts_of(server, run.id)
        assert ALERT_CONTRACT_FIELDS <= set(alert)
        assert (alert["severity"], alert["state"], alert["step"]) == ("critical", "firing", 50)
        assert (
            alert["evidence"]["origin"] == "inputs" and alert["evidence"]["counts"]["inputs"] == 4
        )
        assert alert["hint"] and alert["run_name"] == "nan" and alert["project"] == "default"
        assert [a["id"] for a in server.get("/api/v1/alerts?state=firing")["alerts"]] == [
            alert["id"]
        ]
        assert server.get("/api/v1/alerts?state=resolved")["alerts"] == []

        def pushed() -> bool:
            message = json.loads(browser.recv(timeout=5))
            return bool(message["type"] == "alert" and message["alert"]["id"] == alert["id"])

        wait_for(pushed, timeout=20, interval=0)

    status, acked = server.post(f"/api/v1/alerts/{alert['id']}/ack", {"by": "ana"})
    assert status == 200 and acked["acknowledged_by"] == "ana" and acked["acknowledged_at"]
    status, body = server.post(f"/api/v1/alerts/{alert['id']}/silence", {"duration_s": 600})
    assert status == 200 and body["silence"]["rule"] == "nonfinite"
    assert body["alert"]["silenced_until"] == body["silence"]["until"]
    assert server.post("/api/v1/alerts/nope/ack")[0] == 404
    assert server.post(f"/api/v1/alerts/{alert['id']}/silence", {"duration_s": -1})[0] == 422

    healthy_steps(run, range(60, 200))  # 100 clean steps resolve it
    wait_for(
        lambda: alerts_of(server, run.id)[0]["state"] == "resolved", what="the alert to resolve"
    )
    (resolved,) = alerts_of(server, run.id)
    assert resolved["id"] == alert["id"] and resolved["resolved_time"] >= resolved["time"]
    assert resolved["acknowledged_by"] == "ana"  # people's marks survive the engine's updates
    assert run.finish()
    assert [a["rule"] for a in alerts_of(server, run.id)] == ["nonfinite"]  # completed: no crash


def test_a_crashed_run_gets_a_crash_alert_and_its_other_alerts_close(
    server: ServerProcess,
) -> None:
    run = Run(resolve(server=server.url, run_name="boom"), system_metrics=False, watchdog=False)
    run.start()
    healthy_steps(run, range(1, 20))
    (quiet,) = wait_for(lambda: server.get("/api/v1/runs")["runs"], what="the run")
    assert quiet["health"] == {"worst": None, "rules": [], "firing": []}
    run.log(20, {"loss": math.inf})
    wait_for(lambda: alerts_of(server, run.id, "nonfinite"), what="the nonfinite alert")
    listed = server.get("/api/v1/runs")["runs"][0]
    assert listed["health"] == {"worst": "critical", "rules": ["nonfinite"],
                                "firing": ["nonfinite"]}  # fmt: skip
    trace = "Traceback (most recent call last):\n  ...\nResourceExhaustedError: OOM when allocating"
    assert run.finish("exception", trace)
    wait_for(lambda: alerts_of(server, run.id, "crash"), what="the crash alert")
    crash = alerts_of(server, run.id, "crash")[0]
    assert crash["state"] == "firing" and crash["severity"] == "critical"
    assert "ResourceExhaustedError" in crash["message"]
    assert "smaller batch" in crash["hint"]
    # The NaN alert did not go away: its run ended. Closed, not resolved.
    nonfinite = alerts_of(server, run.id, "nonfinite")[0]
    ended_at = server.get(f"/api/v1/runs/{run.id}")["ended_at"]
    assert (nonfinite["state"], nonfinite["closed_reason"]) == ("closed", "run ended")
    assert nonfinite["closed_time"] == ended_at and nonfinite["resolved_time"] is None
    assert server.get(f"/api/v1/runs/{run.id}/alerts?state=resolved")["alerts"] == []
    closed = server.get(f"/api/v1/runs/{run.id}/alerts?state=closed")["alerts"]
    assert [a["rule"] for a in closed] == ["nonfinite"]
    health = {"worst": "critical", "rules": ["crash", "nonfinite"], "firing": ["crash"]}
    assert server.get(f"/api/v1/runs/{run.id}")["health"] == health
    assert server.get("/api/v1/runs")["runs"][0]["health"] == health
    schema = server.get("/openapi.json")["components"]["schemas"]
    assert set(schema["RunHealth"]["properties"]) == {"worst", "rules", "firing"}
    assert server.get_status(f"/api/v1/runs/{run.id}/alerts?state=gone")[0] == 422


def test_a_bad_rules_file_stops_serve_with_the_setting_named(tmp_path: Path) -> None:
    import subprocess

    rules = tmp_path / "rules.toml"
    rules.write_text("[grad_explosion]\nfactr = 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "trainvitals", "serve", "--port", "0", "--rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "'factr': unknown setting" in result.stderr


def test_the_training_terminal_hears_its_runs_alerts(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(resolve(server=server.url, run_name="loud"), system_metrics=False, watchdog=False)
    with caplog.at_level(logging.WARNING, logger="trainvitals"):
        run.start()
        healthy_steps(run, range(1, 20))
        run.log(20, {"loss": math.nan, "nonfinite/loss": 1.0})

        def logged() -> list[logging.LogRecord] | None:
            return [r for r in caplog.records if " nonfinite on " in r.getMessage()] or None

        (record,) = wait_for(logged, timeout=15, what="the alert in the training's log")
        assert run.finish()
    text = record.getMessage()
    assert record.levelno == logging.ERROR and record.name == "trainvitals"
    assert text.startswith("trainvitals: CRITICAL nonfinite on default/loud at step 20: ")
    assert "\n  What to do: " in text and text.endswith(f"View run at {server.url}/#/runs/{run.id}")


def test_a_loop_of_fits_leaking_between_them_raises_one_forecast_across_its_runs(
    server: ServerProcess,
) -> None:
    """Folds of one process, each flat within its fit, keep 200 MiB each: one forecast for the
    process, before the limit, carried to its newest run and naming the runs it spans."""
    gib, start = 2**30, time.time()
    limit, kept = 4 * gib, 200 * 2**20
    runs: list[Run] = []
    for fold in range(8):  # 40 s a fold (30 s of fit), readings once a second
        run = Run(
            resolve(server=server.url, run_name=f"fold-{fold}"),
            system_metrics=False,
            watchdog=False,
        )
        run.start()
        for second in range(30):
            at = start + 40 * fold + second
            level = gib + fold * kept + (second % 3) * 2**20  # flat, a MiB of jitter
            run.log(second, {"host/working_set": level, "host/limit": limit}, time_=at)
        assert run.finish()
        runs.append(run)
    forecasts = wait_for(
        lambda: [a for a in server.get("/api/v1/alerts")["alerts"] if a["rule"] == "oom_forecast"],
        what="the forecast",
    )
    (forecast,) = forecasts  # one alert for the process, not one a fold
    assert forecast["state"] == "firing" and forecast["evidence"]["trend"] == "between_fits"
    assert forecast["run_id"] == runs[-1].id  # it moved to the newest run
    spanned = [r["name"] for r in forecast["evidence"]["runs"]]
    assert spanned[-1] == "fold-7" and len(spanned) >= 4 and spanned[0] in ("fold-2", "fold-3")
    assert forecast["time"] < start + 40 * 4  # fired within the fourth fold, 10 folds early
    assert 0 < forecast["evidence"]["eta_s"] < 900
    assert "clear_session()" in forecast["hint"] and "gc.collect()" in forecast["hint"]
    assert "200 MiB more kept after each" in forecast["message"]
    assert not [a for a in server.get("/api/v1/alerts")["alerts"] if a["rule"] == "memory_pressure"]
    linked = server.get(f"/api/v1/runs?process={forecast['evidence']['runs'][0]['id']}")
    assert linked["runs"] == []  # the filter is by process key, not run id
    key = server.get(f"/api/v1/runs/{runs[0].id}")["process_key"]
    listed = server.get(f"/api/v1/runs?process={key}")["runs"]
    assert [r["name"] for r in listed][:8] == [f"fold-{i}" for i in reversed(range(8))]
    # The next fit is killed: the alert comes with it and closes, the process being gone.
    last = Run(resolve(server=server.url, run_name="fold-8"), system_metrics=False, watchdog=False)
    last.start()
    assert last.finish("oom_killed")
    closed = wait_for(
        lambda: [a for a in alerts_of(server, last.id, "oom_forecast") if a["state"] == "closed"],
        what="the forecast closed on the killed fit",
    )
    assert closed[0]["id"] == forecast["id"] and closed[0]["closed_reason"] == "process ended"
    assert closed[0]["evidence"]["runs"][-1]["name"] == "fold-8"
