"""The detection core: alert rules over a run's stream, pure Python with no I/O.

The server runs it on every run it ingests; the agent can run it too, for protective
actions. Because nothing here reads a clock or a socket, the same code is tested on
recorded streams.

Example:
    ```python
    from trainvitals.detect import AlertBook, Detector

    detector, book = Detector(), AlertBook()
    for finding in detector.feed({"nonfinite/inputs": Columns([120], [t], [3.0])}):
        change = book.apply(finding)   # ("fired", Alert(rule="nonfinite", ...))
    ```
"""

from __future__ import annotations

from trainvitals.detect.alert_book import RUN_ENDED, Alert, AlertBook, AlertState, Change
from trainvitals.detect.engine import Detector, records, watched
from trainvitals.detect.settings import RulesConfig, RuleSet, load_rules
from trainvitals.detect.types import SEVERITIES, Finding, Record, Severity
from trainvitals.exceptions import RulesError

RULES = (
    "nonfinite", "grad_explosion", "grad_vanishing", "loss_divergence", "loss_above_chance",
    "oom_forecast",
    "memory_pressure", "stall", "slowdown", "thermal", "hardware", "env_mismatch", "crash",
)  # fmt: skip

__all__ = [
    "RULES",
    "RUN_ENDED",
    "SEVERITIES",
    "Alert",
    "AlertBook",
    "AlertState",
    "Change",
    "Detector",
    "Finding",
    "Record",
    "RuleSet",
    "RulesConfig",
    "RulesError",
    "Severity",
    "load_rules",
    "records",
    "watched",
]
