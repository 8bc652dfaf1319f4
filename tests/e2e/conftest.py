from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.browser import chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (Playwright's ``Browser``)."""
    pytest.importorskip("playwright.sync_api")
    try:
        with chromium() as instance:
            yield instance
    except FileNotFoundError as missing:
        pytest.fail(str(missing))
