"""Headless Chromium (Debian's) driven by Playwright, for the dashboard's tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from harness.processes import ServerProcess

T = TypeVar("T")

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


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright ``Browser`` on Debian's Chromium, closed on the way out."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(
            f"Chromium not found at {CHROMIUM}: `make test` installs Debian's chromium"
        )
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


def erring_page(browser: Any, width: int = 1400) -> tuple[Any, list[str]]:
    """A new page of ``browser``, and the errors it will raise (also its ``errors``)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    return page, errors


def delete_before_its_points(server: ServerProcess, page: Any, run_id: str) -> None:
    """Deletes ``run_id`` just before ``page``'s first read of its points goes to the server."""

    def delete_first(route: Any) -> None:
        assert server.send("DELETE", f"/api/v1/runs/{run_id}")[0] == 200
        route.continue_()

    page.route(f"**/api/v1/runs/{run_id}/series?**", delete_first, times=1)


def pumped(page: Any, condition: Callable[[], T]) -> T:
    """``condition()`` after a round trip to ``page``: playwright hands the test its events
    (routed requests, websocket frames, page errors) only while the test is in one of its calls."""
    page.evaluate("0")
    return condition()
