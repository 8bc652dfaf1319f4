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
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1001.0)
        store.alerts.save_alert(conn, {**alert.as_dict(), "evidence": {"loss": "NaN"}})
    resolved = book.apply(Finding("nonfinite", "", False, 9, 1020.0))
    assert resolved is not None
    with store.engine.begin() as conn:
        store.alerts.save_alert(conn, {**resolved[1].as_dict(), "evidence": {"loss": "NaN"}})
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
    with store.engine.begin() as conn:
        acked = store.alerts.acknowledge(conn, alert.id, when=1030.0, by="ana")
        assert acked is not None and acked["acknowledged_by"] == "ana"
        store.alerts.add_silence(
            conn,
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
