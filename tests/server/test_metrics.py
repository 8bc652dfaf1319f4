"""``GET /metrics``: a real server, a real agent streaming, scraped and read back with
``prometheus_client``'s own parser."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from websockets.sync.client import connect

from harness.metrics import Samples, parse, scrape, value
from harness.polling import wait_for, wait_for_async
from harness.processes import ROOT, ServerProcess, create_token
from trainvitals import Run, resolve
from trainvitals.agent.gpu import SimulatedGpu
from trainvitals.exceptions import ConfigurationError
from trainvitals.protocol import LIVE_PATH
from trainvitals.server.app import create_app
from trainvitals.server.metrics import Metrics, RunVitals, TeamCounts
from trainvitals.server.settings import Settings
from trainvitals.server.store import Store

GRAFANA_BOARD = ROOT / "docs" / "grafana-dashboard.json"


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    db = str(tmp_path / "team.db")
    tokens = {
        "scrape": create_token(db, "*", "metrics", "prometheus"),
        "ingest": create_token(db, "p", "ingest", "agents"),
        "read_p": create_token(db, "p", "read", "viewer-p"),
        "read_all": create_token(db, "*", "read", "viewer"),
    }
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        yield server, tokens
    finally:
        server.stop()


def test_metrics_of_a_streaming_run(team: tuple[ServerProcess, dict[str, str]]) -> None:
    server, tokens = team
    run = Run(
        resolve(server=server.url, project="p", run_name="r1", token=tokens["ingest"]),
        system_metrics=0.1,
        gpu=SimulatedGpu(mem_total=16e9, mem_start=3e9, temp_start=71.0),
        watchdog=False,
    )
    run.start()
    browser = connect(
        server.url.replace("http", "ws", 1) + LIVE_PATH,
        additional_headers={"Authorization": f"Bearer {tokens['read_all']}"},
    )
    try:
        steps = 40
        for step in range(1, steps + 1):
            loss = float("nan") if step == steps else 1.0 / step
            run.log(step, {"loss": loss, "step_time": 0.01 * step})
        labels = {"run_id": run.id, "run": "r1", "project": "p"}

        def vitals_in() -> Samples | None:
            status, text = scrape(server, tokens["scrape"])
            assert status == 200, text
            samples = parse(text)
            points = value(samples, "trainvitals_points_ingested_total") or 0
            temp = value(samples, "trainvitals_run_gpu_temperature_celsius", **labels, gpu="0")
            stepped = value(samples, "trainvitals_run_step_seconds", **labels)
            # The NaN's alert is raised once its frame is stored: under load, a scrape between
            # the two finds the points but not yet the alert.
            nan = value(samples, "trainvitals_alerts_firing", rule="nonfinite", severity="critical")
            done = points >= 2 * steps and temp and stepped == 0.01 * steps and nan == 1
            return samples if done else None

        samples = wait_for(vitals_in, timeout=30, what="the run's vitals in /metrics")
        assert value(samples, "trainvitals_run_gpu_temperature_celsius", **labels, gpu="0") == 71
        assert value(samples, "trainvitals_run_gpu_memory_used_bytes", **labels, gpu="0") == 3e9
        assert value(samples, "trainvitals_run_gpu_memory_total_bytes", **labels, gpu="0") == 16e9
        limit = value(samples, "trainvitals_run_host_memory_limit_bytes", **labels)
        rss = value(samples, "trainvitals_run_host_memory_rss_bytes", **labels)
        assert limit and rss and 0 < rss < limit
        assert value(samples, "trainvitals_runs", status="running") == 1
        assert value(samples, "trainvitals_runs", status="finished") == 0
        firing = value(samples, "trainvitals_alerts_firing", rule="nonfinite", severity="critical")
        assert firing == 1
        assert value(samples, "trainvitals_agent_connections") == 1
        assert (value(samples, "trainvitals_frames_ingested_total", type="hello") or 0) >= 1
        assert (value(samples, "trainvitals_frames_ingested_total", type="points") or 0) >= 1
        assert (value(samples, "trainvitals_writer_commit_seconds_count") or 0) >= 2
        assert value(samples, "trainvitals_writer_queue_depth") is not None
        assert value(samples, "trainvitals_browser_connections") == 1
        assert value(samples, "trainvitals_run_vitals_omitted") == 0
    finally:
        browser.close()
        assert run.finish()

    def ended() -> Samples | None:
        samples = parse(scrape(server, tokens["read_all"])[1])  # a reader of every project
        done = value(samples, "trainvitals_runs", status="finished") == 1
        return samples if done else None

    samples = wait_for(ended, what="the finished run in /metrics")
    assert not any(name.startswith("trainvitals_run_") and name != "trainvitals_run_vitals_omitted"
                   for name, _ in samples)  # fmt: skip
    assert (
        value(samples, "trainvitals_alerts_firing", rule="nonfinite", severity="critical") is None
    )


def test_metrics_need_a_token_of_every_project(team: tuple[ServerProcess, dict[str, str]]) -> None:
    server, tokens = team
    assert scrape(server, None)[0] == 401
    assert scrape(server, "tv_0000_not-a-token")[0] == 401
    assert scrape(server, tokens["read_p"])[0] == 403  # it would see other projects' runs
    assert scrape(server, tokens["ingest"])[0] == 403
    # And the scrape token reads nothing else.
    assert server.get_status("/api/v1/runs")[0] == 401
    server.token = tokens["scrape"]
    assert server.get_status("/api/v1/runs")[0] == 403


def test_metrics_are_open_when_auth_is_off(server: ServerProcess) -> None:
    status, text = scrape(server, None)
    assert status == 200
    assert value(parse(text), "trainvitals_runs", status="running") == 0


def test_a_metrics_token_covers_every_project(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "t.db"))
    try:
        store.create_schema()
        with pytest.raises(ConfigurationError, match="expected project '\\*'"):
            store.tokens.create("prometheus", "p", "metrics")
    finally:
        store.dispose()


def test_run_vitals_are_bounded() -> None:
    readings = {"gpu0/temp": 60.0, "gpu15/temp": 61.0, "gpu16/temp": 62.0, "gpu0/util": 90.0}
    vitals = [RunVitals("a", "p", 'say "hi"\n', readings, None)]
    samples = parse(Metrics().exposition(TeamCounts(), vitals, omitted=3).decode())
    temps = {dict(labels)["gpu"]: v for (name, labels), v in samples.items()
             if name == "trainvitals_run_gpu_temperature_celsius"}  # fmt: skip
    assert temps == {"0": 60.0, "15": 61.0}  # at most 16 GPUs a run; only the listed readings
    assert value(samples, "trainvitals_run_vitals_omitted") == 3
    labels = {"run_id": "a", "run": 'say "hi"\n', "project": "p", "gpu": "0"}
    assert value(samples, "trainvitals_run_gpu_temperature_celsius", **labels) == 60.0


def test_a_stalled_event_loop_and_each_garbage_collection_are_measured() -> None:
    metrics = Metrics()
    callbacks = list(gc.callbacks)

    def count(samples: Samples, name: str, **labels: str) -> float:
        return value(samples, name, **labels) or 0.0

    async def stall_and_collect() -> Samples:
        metrics.watch_pauses()
        try:
            await asyncio.sleep(0)  # the lag watch has set its first timer
            time.sleep(0.6)  # a frame's handler that holds the loop up for 0.6 s
            gc.collect()
            lag = "trainvitals_event_loop_lag_seconds_count"

            def measured() -> Samples | None:
                samples = parse(generate_latest(metrics.registry).decode())
                return samples if count(samples, lag) else None

            return await wait_for_async(measured, timeout=10, what="the stall to be measured")
        finally:
            await metrics.stop_watching()

    samples = asyncio.run(stall_and_collect())
    lag = "trainvitals_event_loop_lag_seconds_bucket"
    assert count(samples, lag, le="0.25") < count(samples, lag, le="+Inf")  # 0.35 s late
    assert count(samples, "trainvitals_gc_pause_seconds_count", generation="2") >= 1
    assert gc.callbacks == callbacks  # the watch took its callback away
    gc.collect()
    after = parse(generate_latest(metrics.registry).decode())
    assert after[("trainvitals_gc_pause_seconds_count", frozenset({("generation", "2")}))] == (
        count(samples, "trainvitals_gc_pause_seconds_count", generation="2")
    )


def test_what_start_up_built_is_left_out_of_each_full_collection(tmp_path: Path) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    app = create_app(Settings(db=str(tmp_path / "frozen.db")))
    # Without auth the server answers this machine only: the test client says it is here.
    with TestClient(app, base_url="http://127.0.0.1:8600", client=("127.0.0.1", 50000)) as client:
        # Modules, classes, routes, the store: tens of thousands of objects a full
        # collection under load no longer walks (docs/scaling.md).
        assert gc.get_freeze_count() > 20_000
        assert client.get("/healthz").json() == {"status": "ok", "writer": "ok"}
    gc.unfreeze()


def test_the_grafana_board_uses_only_exported_metrics() -> None:
    board = json.loads(GRAFANA_BOARD.read_text(encoding="utf-8"))
    used = {
        re.sub(r"_(total|bucket|count|sum)$", "", name)
        for panel in board["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"trainvitals_\w+", target["expr"])
    }
    readings = {"gpu0/temp": 1.0, "gpu0/mem_used": 1.0, "gpu0/mem_total": 2.0,
                "host/rss": 1.0, "host/limit": 2.0}  # fmt: skip
    metrics = Metrics()
    metrics.points.inc(1)
    metrics.frame("points")
    team = TeamCounts(firing={("nonfinite", "critical"): 1}, notices={("ops", "failed"): 1,
                      ("ops", "pending"): 2})  # fmt: skip
    text = metrics.exposition(team, [RunVitals("a", "p", "r", readings, 0.1)], 0).decode()
    exported = {
        family.name
        for family in text_string_to_metric_families(text)
        if not family.name.endswith("_created")  # prometheus_client's, beside each counter
    }
    assert used and used <= exported, sorted(used - exported)
    documented = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert [name for name in sorted(exported) if f"`{name}" not in documented] == []
