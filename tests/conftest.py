from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import ServerProcess, postgres_database
from trainvitals.server.store import Store

# Keep TensorFlow quiet and on the CPU in every test process and its children.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real ``trainvitals serve`` on a free port with a fresh SQLite file."""
    process = ServerProcess(str(tmp_path / "trainvitals.db"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each storage test runs on a real SQLite file and a real PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
    else:
        with postgres_database() as url:
            yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A :class:`Store` with its schema, on each of SQLite and PostgreSQL."""
    store = Store(db_url)
    store.create_schema()
    yield store
    store.dispose()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The scenario suite's detections and lead times, after the results."""
    from harness.outcomes import REPORT

    if REPORT:
        terminalreporter.section("trainvitals scenarios: detection and lead time")
        for line in REPORT:
            terminalreporter.write_line(line)
