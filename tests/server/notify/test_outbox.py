"""The notify outbox on a real SQLite file and a real PostgreSQL database: notices stored in
the alert's transaction, routing, leases taken over from a dead server, and marks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from trainvitals.detect import Alert, Change
from trainvitals.server.notify import Channel, Notifier, NotifyConfig
from trainvitals.server.notify.messages import Notice
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer

TEAM = Channel("team", "slack", "https://hooks.slack.com/x", projects=frozenset({"mnist"}))
PAGER = Channel("pager", "webhook", "https://ops.example.org/h", min_severity="critical")


@pytest.fixture
def notifier(store: Store) -> Iterator[Notifier]:
    writer = Writer(store)
    yield Notifier(NotifyConfig((TEAM, PAGER)), store.outbox, writer, lease=10.0)
    writer.close()


def alert(id: str = "a1", **changes: Any) -> Alert:
    return Alert.from_dict({
        "id": id, "run_id": "r1", "project": "mnist", "run_name": "n", "rule": "nonfinite",
        "subject": "", "severity": "warning", "state": "firing", "message": "NaN",
        "hint": "clip", "step": 1, "time": 1.0, "evidence": {}, "silenced_until": None,
        "updated_time": 1.0, **changes,
    })  # fmt: skip


def enqueue(store: Store, notifier: Notifier, *changes: tuple[Change, Alert]) -> list[str]:
    with store.transaction() as work:
        return [f"{n.channel}:{n.change}" for n in notifier.enqueue(work, changes)]


def test_changes_are_routed_by_project_severity_and_silence(
    store: Store, notifier: Notifier
) -> None:
    assert enqueue(store, notifier, ("fired", alert())) == ["team:fired"]
    assert enqueue(store, notifier, ("fired", alert("a2", severity="critical"))) == [
        "team:fired", "pager:fired",
    ]  # fmt: skip
    assert enqueue(store, notifier, ("fired", alert("a3", project="gan"))) == []
    silenced = alert("a4", silenced_until=time.time() + 60)
    assert enqueue(store, notifier, ("fired", silenced)) == []
    assert enqueue(store, notifier, ("updated", alert())) == []  # moving evidence: not sent
    # A resolution goes where the firing went, and only there.
    resolved = alert("a2", severity="critical", state="resolved")
    assert enqueue(store, notifier, ("resolved", resolved)) == ["team:resolved", "pager:resolved"]
    assert enqueue(store, notifier, ("resolved", alert("a3", project="gan"))) == []
    assert enqueue(store, notifier, ("resolved", resolved)) == []  # already told
    # A warning that turns critical reaches the critical-only channel then, once; its
    # resolution goes to both.
    escalated = alert("a6", severity="critical")
    assert enqueue(store, notifier, ("fired", alert("a6"))) == ["team:fired"]
    assert enqueue(store, notifier, ("updated", escalated)) == ["pager:fired"]
    assert enqueue(store, notifier, ("updated", escalated)) == []
    assert enqueue(store, notifier, ("resolved", escalated)) == ["team:resolved", "pager:resolved"]
    # Fired and resolved in one transaction: the resolution follows its firing.
    assert enqueue(store, notifier, ("fired", alert("a5")), ("resolved", alert("a5"))) == [
        "team:fired", "team:resolved",
    ]  # fmt: skip


def test_an_alert_closed_by_its_run_ending_is_sent_nowhere(
    store: Store, notifier: Notifier
) -> None:
    closed = alert("a7", severity="critical", state="closed", closed_reason="run ended")
    assert enqueue(store, notifier, ("fired", alert("a7", severity="critical"))) == [
        "team:fired", "pager:fired",
    ]  # fmt: skip
    assert enqueue(store, notifier, ("closed", closed)) == []  # told it fired, not that it ended
    # Not even to a channel never told of it (an escalation would have been sent as firing).
    assert enqueue(store, notifier, ("fired", alert("a8"))) == ["team:fired"]
    assert enqueue(store, notifier, ("closed", alert("a8", severity="critical"))) == []


def test_a_dead_servers_notices_are_taken_over_once_its_lease_runs_out(store: Store) -> None:
    def notice(id: str, created_at: float, channel: str = "team") -> Notice:
        return Notice(id, channel, "fired", alert(), created_at)

    with store.transaction() as work:
        store.outbox.add_notices(work, [notice("n1", 1.0)], "dead", 100.0)
        store.outbox.add_notices(work, [notice("n2", 2.0)], "alive", 100.0)
        store.outbox.add_notices(work, [notice("n3", 3.0)], "dead", 100.0)
        store.outbox.add_notices(work, [notice("n4", 4.0, channel="gone")], "dead", 100.0)
    with store.transaction() as work:
        assert (
            store.outbox.claim_notices(work, "alive", ["team"], now=99.0, lease_until=200.0) == []
        )
    with store.transaction() as work:  # "alive" renewed its own; "dead" did not
        taken = store.outbox.claim_notices(work, "new", ["team"], now=150.0, lease_until=300.0)
    assert [t["id"] for t in taken] == ["n1", "n3"]  # oldest first; no channel "gone" here
    assert taken[0]["alert"]["rule"] == "nonfinite" and taken[0]["owner"] == "new"
    with store.transaction() as work:  # nobody takes them twice
        assert (
            store.outbox.claim_notices(work, "other", ["team"], now=150.0, lease_until=300.0) == []
        )
        store.outbox.notices_done(work, ["n1"], "delivered", 151.0)
        store.outbox.notice_attempted(work, ["n3"], "HTTP 500")
        store.outbox.notices_done(work, ["n3"], "failed", 152.0, "HTTP 404: no_service")
        store.outbox.release_notices(work, "alive")  # a clean stop
    with store.transaction() as work:
        again = store.outbox.claim_notices(work, "next", ["team"], now=160.0, lease_until=400.0)
    assert [t["id"] for t in again] == ["n2"]
    assert store.outbox.notice_summary()["team"] == {
        "pending": 1, "delivered": 1, "failed": 1, "last_delivered_at": 151.0,
        "last_error": "HTTP 404: no_service",
    }  # fmt: skip
    history = store.outbox.list_notices("a1")
    assert [(n["id"], n["state"], n["attempts"]) for n in history][:3] == [
        ("n1", "delivered", 1), ("n2", "pending", 0), ("n3", "failed", 2),
    ]  # fmt: skip
    with store.transaction() as work:
        assert store.outbox.last_notice_change(work, "a1", "team") == "fired"
        assert store.outbox.last_notice_change(work, "a9", "team") is None
