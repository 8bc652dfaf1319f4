"""Fixtures of the agent's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.processes import ServerProcess


@pytest.fixture
def weights_checked_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift the once-a-second floor of the weights' check: these runs last a second or two."""
    from trainvitals.agent import tf_vitals  # TensorFlow only for the tests that ask

    monkeypatch.setattr(tf_vitals.WeightsCheck, "min_interval", 0.0)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server for a module's many short fits: each makes a run of its own."""
    process = ServerProcess(str(tmp_path_factory.mktemp("server") / "runs.db"))
    try:
        yield process
    finally:
        process.stop()
