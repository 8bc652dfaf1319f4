"""The alert lifecycle: one alert per subject, its updates, escalation and resolution."""

from __future__ import annotations

from trainvitals.detect import (
    Alert,
    AlertBook,
    Finding,
    Severity,
)
from trainvitals.detect.alert_book import RUN_ENDED
from trainvitals.detect.settings import AlertTiming

# -- lifecycle ----------------------------------------------------------------------------


def finding(firing: bool, time: float, severity: Severity = "warning", eta: float = 0) -> Finding:
    return Finding(
        "oom_forecast", "host", firing, int(time), time, severity, "m", "h", {"eta_s": eta}
    )


def test_one_alert_per_subject_updates_at_most_every_interval() -> None:
    ids = iter(["a", "b"])
    book = AlertBook(AlertTiming(cooldown=300, update_interval=5), new_id=lambda: next(ids))
    assert book.apply(finding(True, 0, eta=600))[0] == "fired"  # type: ignore[index]
    assert book.apply(finding(True, 2, eta=590)) is None  # too soon to move the ETA
    change = book.apply(finding(True, 5, eta=580))
    assert change is not None and change[0] == "updated" and change[1].evidence["eta_s"] == 580
    change = book.apply(finding(True, 6, severity="critical"))  # escalation: at once
    assert change is not None and change[1].severity == "critical"
    assert book.apply(finding(False, 10))[0] == "resolved"  # type: ignore[index]
    reopened = book.apply(finding(True, 100))
    assert reopened is not None and reopened[0] == "fired"
    assert (reopened[1].id, reopened[1].count, reopened[1].resolved_time) == ("a", 2, None)
    book.apply(finding(False, 110))
    fresh = book.apply(finding(True, 500))  # past the cooldown: a new alert
    assert fresh is not None and (fresh[1].id, fresh[1].count) == ("b", 1)


def test_a_run_end_closes_its_firing_alerts_but_the_crash() -> None:
    book = AlertBook()
    book.apply(finding(True, 0))
    book.apply(Finding("crash", "", True, 9, 1.0, "critical", "m", "h"))
    closed = book.close_all(2.0, keep=("crash",))
    assert [a.rule for a in closed] == ["oom_forecast"]
    alert = closed[0]
    assert (alert.state, alert.closed_time, alert.closed_reason) == ("closed", 2.0, RUN_ENDED)
    assert (alert.resolved_time, alert.updated_time) == (None, 2.0)  # closed, not resolved
    assert book.alerts[("crash", "")].state == "firing"
    assert book.apply(finding(False, 3)) is None  # nothing left to resolve
    assert book.close_all(4.0, keep=("crash",)) == []  # closed once only
    restored = AlertBook()
    restored.load([Alert.from_dict(a.as_dict()) for a in book.alerts.values()])
    assert restored.apply(Finding("crash", "", True, 9, 3.0, "critical", "m", "h")) is None
