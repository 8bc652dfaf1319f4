"""What channels are sent: Slack Block Kit within Slack's limits, the webhook JSON, and the
HMAC signature receivers verify."""

from __future__ import annotations

import json
from typing import Any

from trainvitals.detect import Alert
from trainvitals.server.notify import Channel, sign, verify_signature
from trainvitals.server.notify.messages import Notice, headers, probe_message, render, run_url

SLACK = Channel("team", "slack", "https://hooks.slack.com/services/T/B/x")
HOOK = Channel("ops", "webhook", "https://ops.example.org/h", secret=b"key")


def alert(**changes: Any) -> Alert:
    return Alert.from_dict({
        "id": "a1", "run_id": "run/1", "project": "mnist", "run_name": "lr <3>", "rule": "stall",
        "subject": "", "severity": "warning", "state": "firing", "message": "No step for 95 s",
        "hint": "Look at the stacks", "step": 1200, "time": 1.0, "evidence": {"idle": 95.1},
        "updated_time": 1.0, **changes,
    })  # fmt: skip


def notice(change: str = "fired", id: str = "n1", **changes: Any) -> Notice:
    return Notice(id, "team", change, alert(**changes), 1.0)  # type: ignore[arg-type]


def slack(*notices: Notice) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(render(SLACK, notices, "https://tv.example.org/").body)
    return message


def test_a_slack_alert_stays_within_slacks_limits_and_escapes_names() -> None:
    stacks = "Thread 'MainThread':\n  File \"train.py\", line 12\n" * 500
    evidence = {"stacks": stacks, **{f"k{i}": i for i in range(20)}}
    message = slack(notice(message="m" * 5000, evidence=evidence, rule="x" * 200))
    assert len(message["blocks"][0]["text"]["text"]) <= 150
    for block in message["blocks"]:
        if "text" in block:
            assert len(block["text"]["text"]) <= 3000
    text = json.dumps(message)
    assert "lr &lt;3&gt;" in text and "lr <3>" not in text.replace(message["text"], "")
    assert "and 13 more on the run page" in text
    assert "https://tv.example.org/#/runs/run%2F1" in text  # the run id is quoted


def test_no_public_url_means_no_link() -> None:
    message = json.loads(render(SLACK, [notice()], None).body)
    assert all(block["type"] != "actions" for block in message["blocks"])
    assert run_url(None, "r") is None


def test_a_group_lists_every_change_under_one_header() -> None:
    group = slack(notice(id="1"), notice("resolved", id="2"), notice(id="3", severity="critical"))
    assert group["blocks"][0]["text"]["text"] == (
        "3 alert changes in trainvitals (2 fired, 1 resolved)"
    )
    lines = [b["text"]["text"] for b in group["blocks"][1:]]
    assert lines[1].startswith(":white_check_mark: *Resolved:* `stall`")
    assert "*CRITICAL*" in lines[2] and "at step 1200" in lines[2]


def test_a_storm_past_group_max_is_one_digest_within_slacks_limits() -> None:
    storm = [
        notice(id=str(i), run_id=f"run-{i}", project=f"team-{i % 9}", rule="crash",
               severity="critical")
        for i in range(3000)
    ] + [notice(id="n", rule="nonfinite", severity="critical")]  # fmt: skip
    digest = slack(*storm)
    assert digest["text"] == "3,001 alert changes in trainvitals (3,001 fired)"
    blocks = digest["blocks"]
    assert len(blocks) == 1 + 1 + SLACK.group_max + 1 <= 50  # Slack's limit on blocks
    summary = blocks[1]["text"]["text"]
    assert "3,000 CRITICAL `crash`" in summary and "1 CRITICAL `nonfinite`" in summary
    assert "3,001 runs · projects: team-0 (334), team-1" in summary
    assert summary.endswith("and 4 more")  # ten projects, six named
    assert blocks[-1]["text"]["text"] == (
        "… and 2,981 more on <https://tv.example.org/#/alerts|the alerts page>"
    )
    assert all(len(json.dumps(b)) < 3100 for b in blocks)
    # Up to group_max, the group lists every change as before.
    assert len(slack(*storm[: SLACK.group_max])["blocks"]) == 1 + SLACK.group_max


def test_the_webhook_body_and_delivery_keys() -> None:
    single = render(HOOK, [notice()], None)
    body = json.loads(single.body)
    assert single.key == "n1" == body["delivery"] == body["items"][0]["delivery"]
    assert body["version"] == 1 and body["type"] == "alerts"
    assert body["items"][0]["alert"]["rule"] == "stall" and body["items"][0]["run_url"] is None
    group = render(HOOK, [notice(id="1"), notice(id="2")], None)
    again = render(HOOK, [notice(id="1"), notice(id="2")], None)
    assert group.key == again.key != render(HOOK, [notice(id="2"), notice(id="1")], None).key
    test = json.loads(probe_message(HOOK, None).body)
    assert test["type"] == "test" and test["channel"] == "ops"


def test_the_signature_verifies_and_rejects_tampering_and_replays() -> None:
    message = render(HOOK, [notice()], None)
    sent = headers(HOOK, message, now=1_000_000.0)
    timestamp, signature = sent["X-Trainvitals-Timestamp"], sent["X-Trainvitals-Signature"]
    assert timestamp == "1000000" and signature == sign(b"key", timestamp, message.body)
    assert signature.startswith("sha256=") and len(signature) == 7 + 64
    assert verify_signature("key", timestamp, message.body, signature, now=1_000_100.0)
    assert not verify_signature("key", timestamp, message.body + b"x", signature, now=1_000_000.0)
    assert not verify_signature("key", "1000001", message.body, signature, now=1_000_000.0)
    assert not verify_signature("key", timestamp, message.body, signature, now=1_000_301.0)
    assert not verify_signature("key", "soon", message.body, signature)
    assert "X-Trainvitals-Signature" not in headers(SLACK, message)
    assert headers(SLACK, message)["X-Trainvitals-Delivery"] == "n1"
