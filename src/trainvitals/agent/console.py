"""What the agent tells the person at the training terminal: where the run is, and its alerts.

At a run's start, one line with the run's dashboard link (``View run lr-3e-4 at ...``); in a
notebook, the run shown inline instead (:mod:`trainvitals.agent.notebook`). Then each warning
or critical alert the server finds in the run, pushed back over the run's own connection
(an ``alert`` frame, ``docs/protocol.md``), logged once on the ``trainvitals`` logger:
``WARNING`` for a warning, ``ERROR`` for a critical one.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from trainvitals.agent import notebook

log = logging.getLogger("trainvitals")

_LEVELS = {"warning": logging.WARNING, "critical": logging.ERROR}
#: The longest message or hint logged as the server sent it (an alert's words are short).
_MAX_TEXT = 2000


def run_url(server: str, run_id: str) -> str:
    """The dashboard's page of a run on ``server`` (the agent's own address for it)."""
    return f"{server.rstrip('/')}/#/runs/{quote(run_id, safe='')}"


def announce(server: str, run_id: str, run_name: str, inline: bool | None = None) -> None:
    """Say once where the run can be watched: inline in a notebook (unless ``inline`` is
    False or ``TRAINVITALS_NOTEBOOK=0``), else one line, logged at INFO where the
    application has set up logging, else printed to stderr (as W&B's "View run at")."""
    url = run_url(server, run_id)
    if notebook.show(url, run_name, inline):
        return
    if log.isEnabledFor(logging.INFO) and (log.handlers or logging.getLogger().handlers):
        log.info("trainvitals: View run %s at %s", run_name, url)
    else:
        print(f"trainvitals: View run {run_name} at {url}", file=sys.stderr, flush=True)


class AlertLog:
    """Logs the ``alert`` frames the server sends a run: each alert once per severity (a
    warning that turns critical is logged again, as critical).

    Called on the sender thread; a frame that is not a well-formed alert is ignored (the
    server's words are data, never trusted to be well formed).
    """

    def __init__(self, server: str) -> None:
        self._server = server
        self._told: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, frame: Mapping[str, Any]) -> None:
        alert = frame.get("alert")
        if not isinstance(alert, Mapping):
            return
        said: dict[str, str] = {}
        for name in ("id", "run_id", "severity", "rule", "message"):
            value = alert.get(name)
            if not isinstance(value, str):
                return
            said[name] = value
        level = _LEVELS.get(said["severity"])
        if level is None:
            return
        with self._lock:
            key = (said["id"], said["severity"])
            if key in self._told:
                return
            self._told.add(key)
        where = f"{alert.get('project')}/{alert.get('run_name')}"
        step = alert.get("step")
        at = f" at step {step}" if isinstance(step, int) else ""
        lines = [
            f"trainvitals: {said['severity'].upper()} {said['rule']} on {where}{at}: "
            + _clean(said["message"])
        ]
        hint = alert.get("hint")
        if isinstance(hint, str) and hint:
            lines.append(f"  What to do: {_clean(hint)}")
        lines.append(f"  View run at {run_url(self._server, said['run_id'])}")
        log.log(level, "%s", "\n".join(lines))


def _clean(text: str) -> str:
    """One line of printable text: no terminal escape sequences from the wire."""
    shown = "".join(c if c.isprintable() else " " for c in text)
    return shown[:_MAX_TEXT]
