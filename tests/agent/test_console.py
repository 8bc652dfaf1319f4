"""What the training terminal is told: the run's link once at its start, and each of its
warning or critical alerts once, from frames the agent's receive loop takes among others."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from harness.polling import wait_for
from tests.agent.peer import running_peer
from tests.agent.test_run import server_of
from trainvitals.agent.config import resolve
from trainvitals.agent.console import AlertLog, announce
from trainvitals.agent.run import Run
from trainvitals.protocol import ACCEPTS_ALERTS, ALERT


def alert_frame(**changes: Any) -> dict[str, Any]:
    alert = {
        "id": "a1", "run_id": "r 1", "project": "mnist", "run_name": "lr-3e-4",
        "rule": "nonfinite", "subject": "", "severity": "critical", "step": 50, "time": 1.0,
        "message": "Loss is NaN at step 50", "hint": "Lower the learning rate", **changes,
    }  # fmt: skip
    return {"type": ALERT, "v": 1, "alert": alert}


def test_each_alert_is_logged_once_per_severity_at_its_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told = AlertLog("http://10.0.0.5:8600/")
    with caplog.at_level(logging.INFO, logger="trainvitals"):
        told(alert_frame(severity="warning"))
        told(alert_frame(severity="warning", message="an update"))  # same alert: not again
        told(alert_frame())  # escalated to critical: once more, as an error
        told(alert_frame(id="a2", severity="info"))  # info stays on the dashboard
        told(alert_frame(id="a3", message=None))  # not an alert: ignored
        told({"type": ALERT, "alert": "nonsense"})
        told(alert_frame(id="a4", message="bad\x1b[2Jterminal\nescape"))
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == [logging.WARNING, logging.ERROR, logging.ERROR]
    assert records[1][1] == (
        "trainvitals: CRITICAL nonfinite on mnist/lr-3e-4 at step 50: Loss is NaN at step 50\n"
        "  What to do: Lower the learning rate\n"
        "  View run at http://10.0.0.5:8600/#/runs/r%201"
    )
    assert "bad [2Jterminal escape" in records[2][1] and "\x1b" not in records[2][1]


def test_a_run_says_where_to_look_once_and_logs_what_the_server_pushes(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_peer() as peer:
        # A newer server's frames: an alert twice, and a type this agent does not know.
        peer.after_welcome = [alert_frame(), {"type": "from-the-future", "v": 9}, alert_frame()]
        server = server_of(peer)
        config = resolve(server=server, run_name="lr-3e-4", flush_interval=0.05)
        run = Run(config, system_metrics=False, watchdog=False)
        with caplog.at_level(logging.WARNING, logger="trainvitals"):
            run.start()
            run.log(1, {"loss": 0.5})
            wait_for(lambda: [r for r in caplog.records if "nonfinite" in r.getMessage()] or None)
            assert run.finish(timeout=10)  # the unknown frame ended nothing
    (hello, *_) = peer.frames()
    assert hello["accepts"] == [ACCEPTS_ALERTS]
    alerts = [r for r in caplog.records if "nonfinite" in r.getMessage()]
    assert len(alerts) == 1 and alerts[0].levelno == logging.ERROR
    assert not [r for r in caplog.records if "cannot handle" in r.getMessage()]
    err = capsys.readouterr().err
    assert err.count("trainvitals: View run lr-3e-4 at ") == 1
    assert f"{server}/#/runs/{run.id}" in err


def test_the_start_line_goes_to_logging_where_the_application_set_it_up(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="trainvitals"):
        announce("http://h:8600", "r1", "try-7")
    assert caplog.messages == ["trainvitals: View run try-7 at http://h:8600/#/runs/r1"]
    assert capsys.readouterr().err == ""


def test_outside_a_notebook_ipython_is_never_imported() -> None:
    code = (
        "import sys, trainvitals\n"
        "from trainvitals.agent.console import announce\n"
        "announce('http://h:8600', 'r1', 'try-7')\n"
        "print('IPython' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"
    assert done.stderr.strip() == "trainvitals: View run try-7 at http://h:8600/#/runs/r1"
