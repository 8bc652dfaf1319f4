"""Fixtures of the agent's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def weights_checked_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift the once-a-second floor of the weights' check: these runs last a second or two."""
    from trainvitals.agent import tf_vitals  # TensorFlow only for the tests that ask

    monkeypatch.setattr(tf_vitals.WeightsCheck, "min_interval", 0.0)
