"""PagerDuty Events API v2: a trigger per alert with its evidence and link, then a resolve
under the same ``dedup_key``; one event per request (never grouped)."""

from __future__ import annotations

import json
from typing import Any

from tests.server.notify.test_messages import notice
from trainvitals.server.notify import Channel
from trainvitals.server.notify.messages import probe_message, render

PAGER = Channel("on-call", "pagerduty", "https://events.pagerduty.com/v2/enqueue", b"rkSECRET")


def event(*notices: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(render(PAGER, notices, "https://tv.example.org").body)
    return body


def test_a_firing_alert_triggers_with_its_evidence_and_link() -> None:
    trigger = event(notice(severity="critical", evidence={"idle": 95.1, "stacks": "x" * 9000}))
    assert trigger["routing_key"] == "rkSECRET" and trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == "a1"  # the alert's id: a retried trigger is one incident
    payload = trigger["payload"]
    assert payload["summary"] == "[CRITICAL] stall on mnist/lr <3>: No step for 95 s"
    assert (payload["severity"], payload["source"], payload["class"]) == (
        "critical",
        "mnist/lr <3>",
        "stall",
    )
    details = payload["custom_details"]
    assert details["what_to_do"] == "Look at the stacks" and details["step"] == 1200
    assert details["evidence"]["idle"] == 95.1 and len(details["evidence"]["stacks"]) == 4000
    assert trigger["links"] == [
        {"href": "https://tv.example.org/#/runs/run%2F1", "text": "Open the run in trainvitals"}
    ]
    assert payload["timestamp"] == "1970-01-01T00:00:01+00:00"
    assert event(notice(severity="warning"))["payload"]["severity"] == "warning"


def test_a_resolution_resolves_the_same_dedup_key() -> None:
    resolve = event(notice("resolved", id="n2"))
    assert resolve == {"routing_key": "rkSECRET", "dedup_key": "a1", "event_action": "resolve"}


def test_the_summary_fits_pagerdutys_limit_and_no_link_without_a_public_url() -> None:
    body = json.loads(render(PAGER, [notice(message="m" * 5000)], None).body)
    assert len(body["payload"]["summary"]) == 1024 and "links" not in body
    probe = json.loads(probe_message(PAGER, None).body)
    assert probe["payload"]["severity"] == "info" and probe["dedup_key"].startswith("test-")
