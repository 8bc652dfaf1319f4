"""A pytest plugin for Keras's own test suite: attaches a ``VitalsCallback`` to every
``Model.fit`` and records each test's outcome.

Loaded by ``benchmarks/keras_suite.py`` (``-p harness.keras_compat``) in both of its passes;
``TRAINVITALS_COMPAT_ATTACH=1`` attaches the callback (the server from ``TRAINVITALS_SERVER``),
and ``TRAINVITALS_COMPAT_OUT`` names a JSON Lines file that gets one line per test:
its node id, its outcome and, attached, how many fits ran with the callback.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class _TestState:
    """What the test running now did: its fits, the warnings they logged, its outcome."""

    fits: int = 0
    warnings: list[str] = field(default_factory=list)
    outcome: str = ""


_state = _TestState()


class _Warnings(logging.Handler):
    """Keeps what the agent warned of during a test: a vital it could not measure is one
    warning, never an exception, and the report shows which tests saw one."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            _state.warnings.append(record.getMessage()[:300])


def _attach() -> None:
    import keras

    import trainvitals

    fit = keras.Model.fit

    @functools.wraps(fit)
    def fit_with_vitals(self: Any, *args: Any, **kwargs: Any) -> Any:
        callbacks = list(kwargs.pop("callbacks", None) or [])
        callbacks.append(trainvitals.VitalsCallback(project="keras-compat", system_metrics=False))
        _state.fits += 1
        return fit(self, *args, callbacks=callbacks, **kwargs)

    keras.Model.fit = fit_with_vitals
    logging.getLogger("trainvitals").addHandler(_Warnings())


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TRAINVITALS_COMPAT_ATTACH") == "1":
        _attach()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _state.fits = 0
    _state.warnings = []
    _state.outcome = "passed"
    yield
    out = os.environ.get("TRAINVITALS_COMPAT_OUT")
    if out:
        line = {
            "test": _test_id(item),
            "outcome": _state.outcome,
            "fits": _state.fits,
            "warnings": sorted(set(_state.warnings)),
        }
        with Path(out).open("a") as file:
            file.write(json.dumps(line) + "\n")


def _test_id(item: pytest.Item) -> str:
    """The test's path under the ``keras`` package and its name: the same in both passes,
    wherever pytest's root directory was."""
    path = item.path.as_posix()
    where = path.rfind("/keras/")
    return (
        (path[where + len("/keras/") :] if where >= 0 else path)
        + "::"
        + item.nodeid.split("::", 1)[-1]
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A failure in any phase fails the test; a skip in setup or call skips it.
    if report.failed:
        _state.outcome = "failed"
    elif report.skipped and _state.outcome == "passed":
        _state.outcome = "skipped"
