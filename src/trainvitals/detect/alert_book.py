"""From findings to alerts: one alert per (rule, subject), firing until resolved or closed.

A rule says "firing" or "clear" for a subject; the book keeps one :class:`Alert` per
(rule, subject) of a run. A finding for a subject already firing updates its alert only when
the severity changes or, for moving evidence such as an ETA, at most every
``update_interval`` seconds. A subject that fires again within ``cooldown`` seconds of
resolving reopens the same alert (its ``count`` goes up) instead of raising a new one. An
alert still firing when its run ends is ``closed`` (the run ended), not ``resolved``: nobody
saw the problem go away.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from trainvitals.detect.settings import AlertTiming
from trainvitals.detect.types import Finding, Severity, jsonable, worse

Change = Literal["fired", "updated", "resolved", "closed"]
AlertState = Literal["firing", "resolved", "closed"]
#: Why an alert was closed: the only reason today.
RUN_ENDED = "run ended"


@dataclass
class Alert:
    """An alert as the API shows it (``run_id``, ``project`` and ``run_name`` are set by
    whoever owns the book)."""

    id: str
    rule: str
    subject: str
    severity: Severity
    state: AlertState
    message: str
    hint: str
    step: int
    time: float
    updated_time: float
    resolved_time: float | None = None
    count: int = 1
    evidence: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    project: str = ""
    run_name: str = ""
    acknowledged_at: float | None = None
    acknowledged_by: str | None = None
    silenced_until: float | None = None
    #: When and why it stopped firing other than by resolving (its run ended).
    closed_time: float | None = None
    closed_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


class AlertBook:
    """The alerts of one run, keyed by (rule, subject)."""

    def __init__(
        self,
        settings: AlertTiming | None = None,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.settings = settings or AlertTiming()
        self._new_id = new_id
        self.alerts: dict[tuple[str, str], Alert] = {}

    def load(self, alerts: Iterable[Alert]) -> None:
        """Take up stored alerts (after a server restart); the newest per key wins."""
        for alert in sorted(alerts, key=lambda a: a.time):
            self.alerts[(alert.rule, alert.subject)] = alert

    def apply(self, finding: Finding) -> tuple[Change, Alert] | None:
        key = (finding.rule, finding.subject)
        alert = self.alerts.get(key)
        if not finding.firing:
            if alert is None or alert.state != "firing":
                return None
            alert.state = "resolved"
            alert.resolved_time = alert.updated_time = finding.time
            return "resolved", alert
        evidence = jsonable(finding.evidence)
        if alert is not None and alert.state == "firing":
            escalated = finding.severity != alert.severity
            due = finding.time - alert.updated_time >= self.settings.update_interval
            if not escalated and not due:
                return None
            alert.severity = (
                worse(alert.severity, finding.severity) if not escalated else (finding.severity)
            )
            alert.message, alert.hint, alert.evidence = finding.message, finding.hint, evidence
            alert.updated_time = finding.time
            return "updated", alert
        if (
            alert is not None
            and alert.resolved_time is not None
            and finding.time - alert.resolved_time < self.settings.cooldown
        ):
            alert.count += 1
            alert.state, alert.resolved_time = "firing", None
            alert.acknowledged_at = alert.acknowledged_by = None
        else:
            alert = Alert(
                id=self._new_id(),
                rule=finding.rule,
                subject=finding.subject,
                severity=finding.severity,
                state="firing",
                message=finding.message,
                hint=finding.hint,
                step=finding.step,
                time=finding.time,
                updated_time=finding.time,
            )
            self.alerts[key] = alert
        alert.severity, alert.message, alert.hint = finding.severity, finding.message, finding.hint
        alert.evidence, alert.step, alert.updated_time = evidence, finding.step, finding.time
        return "fired", alert

    def close_all(
        self, time: float, keep: Iterable[str] = (), reason: str = RUN_ENDED
    ) -> list[Alert]:
        """The run ended: every firing alert but those of the ``keep`` rules is closed (with
        ``reason``), not resolved, since nothing says its cause went away."""
        kept = set(keep)
        closed = []
        for (rule, _), alert in self.alerts.items():
            if alert.state == "firing" and rule not in kept:
                alert.state, alert.updated_time = "closed", time
                alert.closed_time, alert.closed_reason = time, reason
                closed.append(alert)
        return closed

    def find(self, alert_id: str) -> Alert | None:
        return next((a for a in self.alerts.values() if a.id == alert_id), None)
