"""Headless Chromium watches a real training run draw live on the dashboard, and its alerts
reach the banner, the run page, the charts and the alerts page."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from harness.browser import delete_before_its_points, erring_page
from harness.polling import wait_for
from harness.processes import ServerProcess, create_token, demo_training, stream
from trainvitals import Run, resolve

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
expect.set_options(timeout=15_000)  # the 2-core test machine is shared and can be slow


@pytest.fixture
def training(server: ServerProcess) -> Iterator[subprocess.Popen[bytes]]:
    """A real Keras run (the demo's CNN on scikit-learn digits) streaming to the server."""
    process = demo_training(server, "browser-test", epochs=40, pace=0.02)
    yield process
    process.kill()
    process.wait()


def test_run_page_draws_the_live_run(
    server: ServerProcess, training: subprocess.Popen[bytes], browser: Any, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + "/")
    row = page.locator("tr.run-row", has_text="browser-test")
    row.wait_for(timeout=60_000)  # appears live, with no reload
    assert row.locator("[data-status]").get_attribute("data-status") == "running"
    row.click()

    loss_chart = page.locator('[data-chart="loss"]')
    loss_chart.wait_for(timeout=60_000)

    def points() -> int:
        return int(loss_chart.get_attribute("data-points") or 0)

    first = wait_for(points, timeout=30, what="the loss chart's first points")
    grown = wait_for(
        lambda: points() if points() >= first + 20 else 0,
        timeout=60,
        what="the loss chart to grow while training streams",
    )
    assert grown > first
    # Appended in place: the plot holds the same number of points as the chart reports.
    # Drawn in the next animation frame: the plot holds what the chart reports.
    page.wait_for_function(
        """(grown) => document.querySelector('[data-chart="loss"] .plot').data
                 .reduce((n, trace) => n + trace.x.length, 0) >= grown""",
        arg=grown,
    )
    assert page.locator('[data-chart="accuracy"]').count() == 1
    # Charts are found by their ids; their titles are for people.
    titles = {
        "grad_norm": "gradient norm",
        "nonfinite": "NaN/Inf count",
        "host_memory": "host memory",
        "step_time": "step time (s)",
        "host_cpu": "process CPU % (100: one core)",  # the process's, not the host's
    }
    for chart_id, title in titles.items():
        expect(page.locator(f'[data-chart="{chart_id}"] h3')).to_have_text(title, timeout=30_000)
    # Nothing on the charts sends their data to plotly's cloud.
    toolbar = page.evaluate(
        """() => [...document.querySelectorAll('[data-chart="loss"] .modebar-btn')]
                 .map((button) => button.getAttribute('data-title'))"""
    )
    assert "Zoom" in toolbar
    assert not [title for title in toolbar if "Share" in title or "Chart Studio" in title]
    plotly_server = page.evaluate(
        """() => document.querySelector('[data-chart="loss"] .plot')._context.plotlyServerURL"""
    )
    assert plotly_server == ""
    # Per-variable gradient norms that arrive while the page is open are drawn, not hidden.
    # A chart off screen waits to redraw until it is shown (charts.js, schedule): on screen,
    # whatever the layout the run's first series gave the page.
    page.locator('[data-chart="grad_norm"]').scroll_into_view_if_needed()
    wait_for(
        lambda: page.evaluate(
            """() => document.querySelector('[data-chart="grad_norm"] .plot').data
                 .filter((t) => t.name.startsWith('grad/norm/') && t.visible === true).length"""
        ),
        timeout=30,
        what="per-variable gradient norms drawn",
    )
    # The memory chart draws the effective limit beside the process's RSS.
    page.locator('[data-chart="host_memory"]').scroll_into_view_if_needed()
    wait_for(
        lambda: page.locator(
            '[data-chart="host_memory"] .legendtext', has_text="host/limit"
        ).count(),
        timeout=30,
        what="the memory limit line",
    )
    assert page.locator("#live-indicator").get_attribute("data-state") == "live"
    loss_chart.scroll_into_view_if_needed()
    wait_for(
        lambda: page.locator('[data-chart="loss"] .legendtext', has_text="val_loss").count(),
        timeout=60,
        what="the validation loss of the first epoch",
    )
    # The optimizer's learning rate has a chart of its own, not drawn as a Keras metric.
    learning_rate = page.locator('[data-chart="lr"]')
    learning_rate.locator("h3").wait_for(timeout=30_000)
    assert learning_rate.locator("h3").inner_text() == "learning rate"
    assert "running mean" not in learning_rate.inner_text()

    wanted = os.environ.get("TRAINVITALS_SCREENSHOT")
    if wanted:  # the README's picture: let a few epochs draw first
        wait_for(lambda: points() >= 400, timeout=120, what="a few epochs for the screenshot")
    screenshot = Path(wanted or tmp_path / "dashboard.png")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    themed = """(ink) => [...document.querySelectorAll('[data-chart] .plot')]
                 .every((plot) => plot.layout?.font?.color === ink)"""
    page.wait_for_function(themed, arg="#1d2330")

    def all_drawn() -> bool:
        # Every chart on screen, so that none waits to redraw (charts off screen do): the
        # viewport as tall as the page, which grows while charts arrive; then no chart still
        # marked as waiting (the picture waits for the last of them).
        height = page.evaluate("document.documentElement.scrollHeight")
        if height > page.viewport_size["height"]:
            page.set_viewport_size({"width": 1400, "height": height + 200})
            return False
        waiting = "[data-chart][data-stale]:not(.filtered-out)"
        return not page.evaluate(f"() => !!document.querySelector('{waiting}')")

    wait_for(all_drawn, timeout=60, what="every chart on screen and drawn")
    # No row but the last is half empty: a chart before a wide one (the gradient norm's
    # before the layers' heatmap) has a later chart beside it, not a hole.
    half_rows = page.evaluate(
        """() => {
             const grid = document.getElementById('charts');
             const rows = new Map();
             for (const card of grid.children) {
               const box = card.getBoundingClientRect();
               const top = Math.round(box.top);
               if (box.height) rows.set(top, (rows.get(top) ?? 0) + box.width);
             }
             const full = grid.getBoundingClientRect().width;
             return [...rows].sort(([a], [b]) => a - b).slice(0, -1)
               .filter(([, width]) => width < 0.75 * full).length;
           }"""
    )
    assert half_rows == 0
    # The run keeps streaming meanwhile: on a loaded 2-core machine the renderer can take a
    # while to settle a full-page frame of a dozen live charts.
    page.screenshot(path=str(screenshot), full_page=True, animations="disabled", timeout=120_000)
    assert screenshot.stat().st_size > 10_000
    # Dark mode follows the system's, the charts included.
    page.emulate_media(color_scheme="dark")
    page.wait_for_function(themed, arg="#e5e7eb")
    if wanted:
        dark = screenshot.with_name(f"{screenshot.stem}-dark{screenshot.suffix}")
        page.screenshot(path=str(dark), full_page=True, animations="disabled", timeout=120_000)
    assert not errors, errors


def test_unknown_run_page_says_so(server: ServerProcess, browser: Any) -> None:
    page = browser.new_page()
    page.goto(server.url + "/#/runs/does-not-exist")
    page.get_by_text("No run with id 'does-not-exist'").wait_for(timeout=10_000)
    expect(page.locator("h1")).to_have_text("Waiting for this run")


def test_a_run_page_opened_before_its_run_exists_opens_it_when_the_agent_connects(
    server: ServerProcess, browser: Any
) -> None:
    """The address a training script prints can be opened before its agent's hello reaches
    the server: the page waits for the run's first push instead of staying "not found"."""
    run = Run(
        resolve(server=server.url, run_name="late-arrival"), system_metrics=False, watchdog=False
    )
    page = browser.new_page()
    page.goto(f"{server.url}/#/runs/{run.id}")
    expect(page.locator("#run-waiting")).to_contain_text(f"No run with id '{run.id}'")
    run.start()
    try:
        run.log(1, {"loss": 1.0})
        run.log(2, {"loss": 0.5})
        expect(page.locator("#run-name")).to_have_text("late-arrival", timeout=15_000)
        expect(page.locator('[data-chart="loss"]')).to_be_visible(timeout=15_000)
        assert page.locator("#run-waiting").count() == 0
    finally:
        run.finish()


def test_a_crashed_run_shows_its_traceback_its_last_readings_and_its_closed_alert(
    server: ServerProcess, browser: Any
) -> None:
    run = Run(resolve(server=server.url, run_name="died"), system_metrics=False, watchdog=False)
    run.start()
    run.log(1, {"loss": 2.0, "host/rss": 3.5 * 2**30, "host/limit": 4 * 2**30, "gpu0/temp": 91.0})
    run.log(2, {"loss": math.nan})  # fires nonfinite, which the run's end closes
    run.finish("exception", "Traceback (most recent call last):\nMemoryError: out of memory")
    page = browser.new_page()
    page.goto(f"{server.url}/#/runs/{run.id}")
    panel = page.locator(".ending.crashed")
    panel.get_by_text("MemoryError: out of memory").wait_for(timeout=10_000)
    assert "Ended: exception" in panel.inner_text()
    assert "RSS at 88% of the limit" in panel.locator(".last-readings summary").inner_text()
    assert panel.locator('[data-reading="host/rss"]').inner_text() == "3.5 GiB"
    assert panel.locator('[data-reading="gpu0/temp"]').inner_text() == "91 °C"
    expect(page.locator('[data-chart="gpu0_temp"] h3')).to_have_text("gpu0 temperature (°C)")
    closed = page.locator("#run-alert-list .alert-item[data-rule='nonfinite']")
    expect(closed).to_have_attribute("data-state", "closed")
    expect(closed.locator(".alert-standing")).to_contain_text("Closed at run end")
    expect(closed.locator(".alert-standing")).not_to_contain_text("Resolved")


def test_the_run_page_shows_the_status_the_server_sends(
    server: ServerProcess, browser: Any
) -> None:
    config = resolve(server=server.url, run_name="pauses")
    config = dataclasses.replace(config, stall_factor=1.0, stall_floor=0.5)
    run = Run(config, system_metrics=False, watchdog=False)
    run.start()
    try:
        clean_steps(run, range(1, 20))
        # The agent says hello from its own thread: on a busy host the page could ask first.
        known = f"/api/v1/runs/{run.id}"
        wait_for(lambda: server.get_status(known)[0] == 200, what="the run on the server")
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/#/runs/{run.id}")
        status = page.locator("#run-status [data-status]")
        # No step for over half a second: stalled, with every thread's stack.
        expect(status).to_have_attribute("data-status", "stalled")
        expect(page.locator("[data-panel='stall']")).to_contain_text("Stalled")
        # Steps again (one per poll, so that it does not stall anew): running, and the stall
        # panel goes with the stall.
        steps = iter(range(20, 10_000))

        def resumed() -> bool:
            clean_steps(run, range(next(steps), 10_000)[:1])
            shown = status.get_attribute("data-status")
            return shown == "running" and not page.locator("#run-ending > *").count()

        wait_for(resumed, what="the run page to show the run running again")
    finally:
        run.finish()
    expect(status).to_have_attribute("data-status", "finished")
    assert server.get(f"/api/v1/runs/{run.id}")["status"] == "finished"
    expect(page.locator("#run-ending .ending.finished")).to_contain_text("Finished at")
    assert not errors, errors


def test_names_from_a_run_are_text_on_the_page(server: ServerProcess, browser: Any) -> None:
    run = Run(
        resolve(server=server.url, run_name="<i>tilted</i>"), system_metrics=False, watchdog=False
    )
    run.start()
    try:
        run.log(1, {"loss": 1.0, "<b>bold</b>": 2.0, 'acc "top-5"': 0.5})
        run.log(2, {"loss": 0.5, "<b>bold</b>": 3.0, 'acc "top-5"': 0.6})
        page = browser.new_page()
        page.goto(server.url + "/")
        expect(page.locator(f"tr.run-row[data-run-id='{run.id}'] a")).to_have_text("<i>tilted</i>")
        page.goto(f"{server.url}/#/runs/{run.id}")
        expect(page.locator("#run-name")).to_have_text("<i>tilted</i>")
        chart = page.locator('[data-chart="<b>bold</b>"]')
        expect(chart.locator("h3")).to_have_text("<b>bold</b>")
        expect(chart.locator(".legendtext")).to_have_text("<b>bold</b>")
        quoted = page.locator("[data-chart='acc \"top-5\"']")
        expect(quoted.locator(".legendtext")).to_have_text('acc "top-5"')  # not &quot;
        assert page.locator("#app i, #app b").count() == 0
    finally:
        run.finish()


def live_runs_page(server: ServerProcess, browser: Any) -> tuple[Any, list[str]]:
    """The runs list, open and live, and the page errors it will raise."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + "/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    return page, errors


def run_alerts(server: ServerProcess, run_id: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = server.get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
    return alerts


def chart_shapes(page: Any, chart: str) -> list[dict[str, Any]]:
    shapes: list[dict[str, Any]] = page.evaluate(
        '(key) => document.querySelector(`[data-chart="${key}"] .plot`).layout.shapes ?? []',
        chart,
    )
    return shapes


def clean_steps(run: Run, steps: range) -> None:
    for step in steps:
        run.log(step, {"loss": 1.0 / step, "nonfinite/inputs": 0.0, "nonfinite/loss": 0.0})


def test_an_alert_reaches_the_banner_the_run_page_and_its_charts(
    server: ServerProcess, browser: Any
) -> None:
    page, errors = live_runs_page(server, browser)

    run = Run(
        resolve(server=server.url, project="mnist", run_name="nan-batch"),
        system_metrics=False,
        watchdog=False,
    )
    run.start()
    try:
        clean_steps(run, range(1, 50))
        for step in range(50, 60):  # a batch with NaN in it, then NaN loss for a while
            nonfinite = {"nonfinite/inputs": 4.0 if step == 50 else 0.0, "nonfinite/loss": 1.0}
            run.log(step, {"loss": math.nan, **nonfinite})

        # Pushed to the page already open: the banner, and the run's count on the runs list.
        banner = page.locator("#alert-banner .banner-item[data-rule='nonfinite']")
        banner.wait_for(timeout=30_000)
        (alert,) = run_alerts(server, run.id)
        expect(banner).to_have_attribute("data-severity", "critical")
        expect(banner).to_contain_text(alert["message"])
        # Hints show their `code spans` as code.
        expect(banner).to_contain_text(alert["hint"].replace("`", ""))
        row = page.locator(f"tr.run-row[data-run-id='{run.id}']")
        expect(row.locator("[data-firing-alerts]")).to_have_text("1 firing")

        # The run page lists it with its hint and evidence, and marks it on its charts.
        banner.get_by_role("link", name="mnist / nan-batch").click()
        item = page.locator(f"#run-alert-list [data-alert-id='{alert['id']}']")
        expect(item).to_have_attribute("data-state", "firing")
        expect(item.locator(".alert-hint")).to_contain_text(alert["hint"].replace("`", ""))
        item.get_by_text("Evidence").click()
        expect(item.locator(".alert-evidence tr", has_text="origin")).to_contain_text("inputs")
        for chart in ("nonfinite", "loss"):
            marked = page.locator(f'[data-chart="{chart}"]')
            expect(marked).to_have_attribute("data-alert-markers", "1")
        marker = chart_shapes(page, "loss")[0]
        assert (marker["x0"], marker["line"]["color"]) == (50, "#d64545")

        # Acknowledged: off the banner at once, and stored by the server.
        banner.get_by_role("button", name="Acknowledge").click()
        expect(banner).to_have_count(0)
        wait_for(
            lambda: run_alerts(server, run.id)[0]["acknowledged_at"],
            what="the acknowledgement stored",
        )
        expect(item.locator(".alert-standing")).to_contain_text("Acknowledged")
        expect(item.get_by_role("button", name="Acknowledge")).to_have_count(0)
        item.get_by_role("button", name="Silence 1h").click()
        expect(item.locator(".alert-standing")).to_contain_text("Silenced until")
        expect(item.locator(".alert-evidence")).to_have_attribute("open", "")  # kept open

        # Clean steps resolve it, live; its marker stays on the chart, dotted.
        clean_steps(run, range(60, 200))
        expect(item).to_have_attribute("data-state", "resolved", timeout=30_000)
        # The chart redraws at its own pace (at most every 250 ms, more under load).
        page.wait_for_function(
            """() => (document.querySelector('[data-chart="loss"] .plot').layout.shapes ?? [])
                     [0]?.line?.dash === 'dot'"""
        )
        assert chart_shapes(page, "loss")[0]["line"]["color"] == "#d64545"

        # The alerts page: the recent alerts of every state, each with its state (the firing
        # ones alone, none now, said "0 alerts" after a run ended); the firing ones on request.
        page.get_by_role("navigation").get_by_role("link", name="Alerts").click()
        expect(page.get_by_label("State")).to_have_value("")
        listed = page.locator(f"#alert-list [data-alert-id='{alert['id']}']")
        expect(listed).to_contain_text("mnist / nan-batch")
        expect(listed.locator(".alert-state")).to_have_text("resolved")
        page.get_by_label("State").select_option("firing")
        expect(page.locator("#alert-list .alert-empty")).to_be_visible()
        assert page.evaluate("location.hash") == "#/alerts?state=firing"
        page.reload()
        expect(page.get_by_label("State")).to_have_value("firing")
        expect(page.locator("#alert-list .alert-empty")).to_be_visible()
        page.get_by_label("State").select_option("")
        assert page.evaluate("location.hash") == "#/alerts"
        expect(listed).to_contain_text("mnist / nan-batch")
    finally:
        run.finish()
    assert not errors, errors


def test_the_memory_chart_draws_the_oom_forecast_up_to_the_limit(
    server: ServerProcess, browser: Any
) -> None:
    run = Run(resolve(server=server.url, run_name="leak"), system_metrics=False, watchdog=False)
    run.start()
    try:
        limit = 4 * 2**30
        start = time.time() - 60
        for i in range(60):  # a minute of RSS growing 4 MiB/s from 2 GiB: the limit in ~8 min
            rss = 2 * 2**30 + i * 4 * 2**20
            run.log(i, {"loss": 1.0, "host/rss": rss, "host/limit": limit}, time_=start + i)
        alert = wait_for(
            lambda: [a for a in run_alerts(server, run.id) if a["rule"] == "oom_forecast"],
            what="the oom_forecast alert",
        )[0]
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/#/runs/{run.id}")
        memory = page.locator('[data-chart="host_memory"]')
        expect(memory).to_have_attribute("data-forecasts", "1")
        (line,) = [s for s in chart_shapes(page, "host_memory") if s["line"]["dash"] == "dash"]
        forecast = alert["evidence"]["forecast"]
        assert (line["x0"], line["x1"]) == tuple(forecast["step"])
        assert line["y1"] == limit
        expect(memory.locator(".annotation", has_text="limit in ~")).to_have_count(1)
        expect(page.locator("#alert-banner .banner-item[data-rule='oom_forecast']")).to_be_visible()
    finally:
        run.finish()
    assert not errors, errors


def test_the_workers_of_a_job_are_grouped_and_compared_live(
    server: ServerProcess, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, errors = live_runs_page(server, browser)

    cluster = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"]}
    workers: list[Run] = []

    def start_worker(index: int) -> Run:
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(task))
        run = Run(
            resolve(server=server.url, project="dist", run_name=f"sync-{index}"),
            system_metrics=False,
            watchdog=False,
        )
        run.start()
        workers.append(run)
        return run

    def steps(run: Run, first: int, last: int, seconds: float) -> None:
        for step in range(first, last + 1):
            run.log(step, {"loss": 1.0 / step, "step_time": seconds, "host/rss": 2e9 + step})

    try:
        first, second = start_worker(0), start_worker(1)
        steps(first, 1, 20, 0.010)
        steps(second, 1, 20, 0.030)  # the straggler

        # The runs list shows them under one job, in worker order.
        job_row = page.locator("tr.job-row")
        expect(job_row.locator("[data-job-workers]")).to_have_text("2 workers")
        rows = page.locator("tr.job-row ~ tr.job-member")
        expect(rows).to_have_count(2)
        expect(rows.nth(0).locator(".worker-tag")).to_have_text("worker:0")
        expect(rows.nth(1).locator(".worker-tag")).to_have_text("worker:1")

        # The run page compares the workers' step times and follows them live.
        rows.nth(0).locator("a").click()
        panel = page.locator("[data-panel='job']")
        expect(panel.locator("tbody tr")).to_have_count(2)
        expect(panel.locator(f"tr[data-run-id='{second.id}'] a")).to_have_text("sync-1")
        step_times = panel.locator("[data-chart='job_step_time']")
        expect(step_times).to_have_attribute("data-points", "40")
        steps(second, 21, 30, 0.030)
        expect(step_times).to_have_attribute("data-points", "50")
        # Charts off screen wait to redraw until they are seen.
        step_times.scroll_into_view_if_needed()
        page.wait_for_function(
            "() => document.querySelector(\"[data-chart='job_step_time'] .plot\")"
            ".data.map((trace) => trace.name).sort().join() === 'worker:0,worker:1'"
        )
        expect(panel.locator("[data-chart='job_host_rss']")).to_have_attribute("data-points", "50")

        # A worker that joins later appears in the panel and on its charts without a reload.
        third = start_worker(2)
        steps(third, 1, 5, 0.010)
        expect(panel.locator("tbody tr")).to_have_count(3)
        expect(step_times).to_have_attribute("data-points", "55")
        expect(page.locator("[data-fact='Worker']")).to_have_text("worker:0 of 3 in the job")

        # A worker deleted while the page is open is marked so; its traces are kept.
        assert third.finish()
        assert server.send("DELETE", f"/api/v1/runs/{third.id}")[0] == 200
        deleted = panel.locator(f"tr[data-run-id='{third.id}'] [data-deleted]")
        expect(deleted).to_have_text("deleted")
        expect(step_times).to_have_attribute("data-points", "55")
        # One deleted just before a page reads its series leaves that page whole.
        assert second.finish()
        fresh, fresh_errors = erring_page(browser)
        delete_before_its_points(server, fresh, second.id)
        fresh.goto(f"{server.url}/#/runs/{first.id}")
        fresh_panel = fresh.locator("[data-panel='job']")
        expect(fresh_panel.locator(f"tr[data-run-id='{second.id}'] [data-deleted]")).to_be_visible()
        expect(fresh.locator("#run-name")).to_have_text("sync-0")
        fresh.evaluate("0")
        assert not errors and not fresh_errors, errors + fresh_errors
    finally:
        for run in workers:
            run.finish()


def test_an_error_from_the_server_is_shown_as_text_not_run_as_html(
    server: ServerProcess, browser: Any
) -> None:
    # A 422 reads as the Python client's reason, one line (not FastAPI's JSON, which repeats
    # the input); a 404 repeats the run id asked for: the page shows it, never parses it.
    payload = '<img src=x onerror="window.__xss=1">'
    page = browser.new_page()
    page.goto(f"{server.url}/#/alerts?state={quote(payload)}")
    error = page.locator("#app .error")
    expect(error).to_contain_text("422: query.state: Input should be 'firing', 'resolved'")
    page.goto(f"{server.url}/#/runs/{quote(payload)}")
    expect(error).to_contain_text("404")
    expect(error).to_contain_text("<img src=x onerror=")
    assert page.locator("#app img").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"


def test_a_team_server_asks_for_a_token_once_then_shows_its_project(
    browser: Any, tmp_path: Path
) -> None:
    db = str(tmp_path / "team.db")
    viewer = create_token(db, "p", "read", "viewer-p")
    agents = create_token(db, "*", "ingest", "agents")
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        run_id = stream(server, agents, "p")
        stream(server, agents, "q")
        context = browser.new_context()
        page = context.new_page()
        page.goto(server.url + "/")
        form = page.locator("form.sign-in")
        expect(form).to_be_visible()
        form.locator("input[name=token]").fill("tv_0000_wrong")
        form.locator("button").click()
        expect(form.locator(".error")).to_have_text("Unknown or revoked token.")
        form.locator("input[name=token]").fill(viewer)
        form.locator("button").click()
        expect(page.locator("#who")).to_contain_text("viewer-p")
        rows = page.locator("#app table tbody tr")
        expect(rows).to_have_count(1)  # p's run; q's is not this token's to see
        # The cookie is the session: no script can read it, and the page never kept the token.
        cookies = context.cookies()
        assert [c["httpOnly"] for c in cookies if c["name"] == "tv_session"] == [True]
        assert page.evaluate("document.cookie") == ""
        assert viewer not in page.evaluate(
            "JSON.stringify(localStorage) + JSON.stringify(sessionStorage)"
        )
        # The alerts page offers the projects the token sees: p, not q.
        page.locator(".topbar nav a", has_text="Alerts").click()
        options = page.locator("#alert-filters select[name=project] option")
        expect(options).to_have_text(["Any project", "p"])
        page.go_back()
        # A chart's download (the export route, followed as a link) goes with the cookie.
        rows.first.locator("a").click()
        with page.expect_download() as started:
            page.locator('[data-chart="loss"] [data-tool="csv"]').click()
        started.value.save_as(tmp_path / "loss.csv")
        lines = (tmp_path / "loss.csv").read_text().splitlines()
        assert lines[0] == "name,step,time,value" and lines[1].startswith("loss,1,")
        assert run_id in started.value.url
        context.close()
    finally:
        server.stop()


def test_a_runs_page_shows_its_process_memory_across_the_processs_runs(
    server: ServerProcess, browser: Any
) -> None:
    """Three fits of one process (this one), each flat and each 200 MiB above the last: the
    last fit's page lists the three and charts their working sets on one chart with the
    limit, in wall-clock time."""
    start, folds = time.time() - 100, []
    for fold in range(3):
        run = Run(resolve(server=server.url, run_name=f"fold-{fold}"), system_metrics=False,
                  watchdog=False)  # fmt: skip
        run.start()
        for second in range(10):
            level = 2**30 + fold * 200 * 2**20
            values = {"loss": 1.0, "host/working_set": level, "host/limit": 4.0 * 2**30}
            run.log(second + 1, values, time_=start + 30 * fold + second)
        assert run.finish()
        folds.append(run)
    page, errors = erring_page(browser)
    page.goto(f"{server.url}/#/runs/{folds[-1].id}")
    panel = page.locator("[data-panel='process']")
    expect(panel.locator("tbody tr")).to_have_count(3)
    expect(panel.locator(f"tr[data-run-id='{folds[0].id}'] a")).to_have_text("fold-0")
    chart = panel.locator("[data-chart='process_memory']")
    expect(chart).to_have_attribute("data-points", "60")  # three runs' 10 readings, the limit's 30
    chart.scroll_into_view_if_needed()
    page.wait_for_function(
        "() => document.querySelector(\"[data-chart='process_memory'] .plot\")"
        ".data.map((trace) => trace.name).sort().join() === 'fold-0,fold-1,fold-2,limit'"
    )
    assert errors == []
