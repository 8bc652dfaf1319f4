"""Alerts in storage: upserted, filtered, acknowledged and silenced."""

from __future__ import annotations

import math

from tests.server.storage.rows import hello
from trainvitals.server.store import Store


def test_alerts_are_upserted_filtered_acknowledged_and_silenced(store: Store) -> None:
    from trainvitals.detect import AlertBook, Finding

    book = AlertBook()
    fired = book.apply(
        Finding("nonfinite", "", True, 7, 1010.0, "critical", "NaN", "fix", {"loss": math.nan})
    )
    assert fired is not None
    alert = fired[1]
    alert.run_id, alert.project, alert.run_name = "r1", "proj", "name-r1"
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1001.0)
        store.alerts.save_alert(work, {**alert.as_dict(), "evidence": {"loss": "NaN"}})
    resolved = book.apply(Finding("nonfinite", "", False, 9, 1020.0))
    assert resolved is not None
    with store.transaction() as work:
        store.alerts.save_alert(work, {**resolved[1].as_dict(), "evidence": {"loss": "NaN"}})
    (row,) = store.alerts.list_alerts(run_id="r1")
    assert (row["state"], row["resolved_time"], row["evidence"]) == (
        "resolved",
        1020.0,
        {"loss": "NaN"},
    )
    assert (
        store.alerts.list_alerts(state="firing") == []
        and store.alerts.list_alerts(project="other") == []
    )
    assert store.alerts.list_alerts(severity="critical")[0]["id"] == alert.id
    with store.transaction() as work:
        acked = store.alerts.acknowledge(work, alert.id, when=1030.0, by="ana")
        assert acked is not None and acked["acknowledged_by"] == "ana"
        store.alerts.add_silence(
            work,
            {
                "id": "s1",
                "run_id": "r1",
                "rule": "nonfinite",
                "subject": "",
                "until": 2000.0,
                "created_at": 1030.0,
                "created_by": None,
            },
        )
    assert store.alerts.get_alert(alert.id)["silenced_until"] == 2000.0  # type: ignore[index]
    assert [s["id"] for s in store.alerts.active_silences(now=1500.0)] == ["s1"]
    assert store.alerts.active_silences(now=2500.0) == []
    # A shorter silence set later replaces the one in force: the alert said it ended in a
    # minute, and the hour-long one before it still silenced the alert when it fired again.
    hour, minute = (
        {"id": sid, "run_id": "r1", "rule": "nonfinite", "subject": "", "until": until,
         "created_at": at, "created_by": None}
        for sid, until, at in (("s2", 6600.0, 3000.0), ("s3", 3160.0, 3100.0))
    )  # fmt: skip
    for silence in (hour, minute):
        with store.transaction() as work:
            store.alerts.add_silence(work, silence)  # type: ignore[arg-type]
    assert store.alerts.get_alert(alert.id)["silenced_until"] == 3160.0  # type: ignore[index]
    assert [s["id"] for s in store.alerts.active_silences(now=3101.0)] == ["s3"]
    assert store.alerts.active_silences(now=3200.0) == []


def test_standings_give_each_runs_rules_their_worst_severity_in_one_query(
    store: Store,
) -> None:
    from trainvitals.detect import AlertBook, Finding
    from trainvitals.server.storage import RuleStanding

    books = {"r1": AlertBook(), "r2": AlertBook()}
    findings = [
        ("r1", Finding("grad_explosion", "", True, 5, 1.0, "warning", "m", "h")),
        ("r1", Finding("grad_explosion", "", True, 6, 99.0, "critical", "m", "h")),
        ("r1", Finding("slowdown", "", True, 7, 3.0, "warning", "m", "h")),
        ("r1", Finding("slowdown", "", False, 8, 4.0)),  # resolved
        ("r1", Finding("slowdown", "", True, 9, 900.0, "info", "m", "h")),  # a new one
        ("r2", Finding("thermal", "gpu0", True, 5, 1.0, "warning", "m", "h")),
    ]
    with store.transaction() as work:
        for run_id in ("r1", "r2", "r3"):
            store.runs.open_run(work, hello(run_id), now=1.0)
        for run_id, finding in findings:
            change = books[run_id].apply(finding)
            assert change is not None
            alert = change[1]
            alert.run_id, alert.project, alert.run_name = run_id, "proj", run_id
            store.alerts.save_alert(work, alert.as_dict())
        closed = books["r2"].close_all(10.0)
        store.alerts.save_alert(work, {**closed[0].as_dict(), "run_id": "r2",
                                       "project": "proj", "run_name": "r2"})  # fmt: skip
    assert sorted(store.alerts.standings(["r1", "r2", "r3"])) == [
        RuleStanding("r1", "grad_explosion", "critical", True),
        RuleStanding("r1", "slowdown", "warning", True),  # the resolved warning counts
        RuleStanding("r2", "thermal", "warning", False),  # closed
    ]
    assert store.alerts.standings([]) == []
    assert [a["state"] for a in store.alerts.list_alerts(state="closed")] == ["closed"]
