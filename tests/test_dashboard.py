"""Headless Chromium watches a real training run draw live on the dashboard."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ServerProcess, demo_training, wait_for

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("TRAINVITALS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# No background networking: this machine's network is closed, and the test must not wait on it.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: `make test` installs Debian's chromium")
    with playwright_api.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


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
    drawn = page.evaluate(
        """() => document.querySelector('[data-chart="loss"] .plot').data
                 .reduce((n, trace) => n + trace.x.length, 0)"""
    )
    assert drawn >= grown
    assert page.locator('[data-chart="accuracy"]').count() == 1
    for section in ("gradient norm", "NaN/Inf count", "host memory", "step_time"):
        page.locator(f'[data-chart="{section}"]').wait_for(timeout=30_000)
    # Per-variable gradient norms that arrive while the page is open are drawn, not hidden.
    wait_for(
        lambda: page.evaluate(
            """() => document.querySelector('[data-chart="gradient norm"] .plot').data
                 .filter((t) => t.name.startsWith('grad/norm/') && t.visible === true).length"""
        ),
        timeout=30,
        what="per-variable gradient norms drawn",
    )
    # The memory chart draws the effective limit beside the process's RSS.
    wait_for(
        lambda: page.locator(
            '[data-chart="host memory"] .legendtext', has_text="host/limit"
        ).count(),
        timeout=30,
        what="the memory limit line",
    )
    assert page.locator("#live-indicator").get_attribute("data-state") == "live"
    wait_for(
        lambda: page.locator('[data-chart="loss"] .legendtext', has_text="val_loss").count(),
        timeout=60,
        what="the validation loss of the first epoch",
    )

    wanted = os.environ.get("TRAINVITALS_SCREENSHOT")
    if wanted:  # the README's picture: let a few epochs draw first
        wait_for(lambda: points() >= 400, timeout=120, what="a few epochs for the screenshot")
    screenshot = Path(wanted or tmp_path / "dashboard.png")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    assert not errors, errors


def test_unknown_run_page_says_so(server: ServerProcess, browser: Any) -> None:
    page = browser.new_page()
    page.goto(server.url + "/#/runs/does-not-exist")
    page.get_by_text("No run with id 'does-not-exist'").wait_for(timeout=10_000)
