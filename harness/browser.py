"""Headless Chromium (Debian's) driven by Playwright, for the dashboard's tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
