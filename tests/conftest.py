from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from harness.processes import ServerProcess, postgres_database
from trainvitals.server.store import Store

# Keep TensorFlow quiet and on the CPU in every test process and its children.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


#: The tests that take half a minute or more (a wheel installed into a fresh virtualenv, a leak
#: run to its OOM kill), started first: pytest-xdist hands tests out in collection order, and
#: the wheel's test, collected last, kept one worker busy while the others had finished.
LONGEST = (
    "tests/test_packaging.py::test_wheel_in_a_fresh_virtualenv_serves_the_dashboard",
    "tests/e2e/test_scenarios.py::test_a_leak_is_forecast_before_the_oom_killer_ends_it",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST))  # stable: the rest in order


@pytest.fixture(autouse=True)
def own_spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's runs spool in a directory of its own (so do the processes it starts): a
    spool one test leaves undelivered is never delivered by another test's run."""
    spool = tmp_path / "spool"
    monkeypatch.setenv("TRAINVITALS_SPOOL_DIR", str(spool))
    return spool


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


#: The scenario lines of every test, gathered where the results are reported (with
#: pytest-xdist, in the controller: each worker's lines ride in its reports).
_SCENARIO_LINES: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    from harness.outcomes import REPORT

    report: pytest.TestReport = yield
    if report.when == "call" and REPORT:
        report.user_properties.extend(("scenario", line) for line in REPORT)
        REPORT.clear()
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SCENARIO_LINES.extend(str(line) for key, line in report.user_properties if key == "scenario")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The scenario suite's detections and lead times, after the results."""
    if _SCENARIO_LINES:
        terminalreporter.section("trainvitals scenarios: detection and lead time")
        for line in _SCENARIO_LINES:
            terminalreporter.write_line(line)
