"""PagerDuty Events API v2: an alert ``trigger``\\s an incident, its resolution ``resolve``\\s it.

Each alert is one PagerDuty alert: its id is the event's ``dedup_key``, so a retried trigger
is one incident, and the resolve names the incident it closes. The routing key (the
channel's secret) travels in the body, which is never logged.
See https://developer.pagerduty.com/docs/events-api-v2/trigger-events/.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trainvitals.server.notify.config import Channel
from trainvitals.server.notify.text import Notice, cut, run_url, summary

# PagerDuty's limits: summary 1024 characters, dedup_key 255, the whole event 512 KB.
_SUMMARY_CHARS = 1024
_DEDUP_CHARS = 255
_DETAIL_VALUE_CHARS = 4000
#: Our severities in PagerDuty's words (it also has ``error``, which we do not use).
_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def event(channel: Channel, notice: Notice, public_url: str | None) -> dict[str, Any]:
    """The event that tells PagerDuty about one alert change."""
    alert = notice.alert
    base = {"routing_key": _routing_key(channel), "dedup_key": cut(alert.id, _DEDUP_CHARS)}
    if notice.change == "resolved":
        return {**base, "event_action": "resolve"}
    url = run_url(public_url, alert.run_id)
    details: dict[str, Any] = {
        "message": alert.message,
        "what_to_do": alert.hint,
        "rule": alert.rule,
        "subject": alert.subject,
        "project": alert.project,
        "run": alert.run_name,
        "run_id": alert.run_id,
        "step": alert.step,
        "evidence": {
            name: cut(value, _DETAIL_VALUE_CHARS) if isinstance(value, str) else value
            for name, value in alert.evidence.items()
        },
    }
    payload = {
        "summary": cut(summary(notice), _SUMMARY_CHARS),
        "severity": _SEVERITY.get(alert.severity, "warning"),
        "source": f"{alert.project}/{alert.run_name}",
        "component": alert.run_name,
        "group": alert.project,
        "class": alert.rule,
        "timestamp": datetime.fromtimestamp(alert.time, UTC).isoformat(),
        "custom_details": details,
    }
    out: dict[str, Any] = {
        **base,
        "event_action": "trigger",
        "client": "trainvitals",
        "payload": payload,
    }
    if url:
        out["client_url"] = url
        out["links"] = [{"href": url, "text": "Open the run in trainvitals"}]
    return out


def probe(channel: Channel, key: str, text: str) -> dict[str, Any]:
    """``notify-test``'s event: an ``info`` trigger with a dedup_key of its own. It opens an
    incident where the service's rules page on info; resolve it there."""
    return {
        "routing_key": _routing_key(channel),
        "dedup_key": key,
        "event_action": "trigger",
        "client": "trainvitals",
        "payload": {"summary": text, "severity": "info", "source": "trainvitals notify-test"},
    }


def _routing_key(channel: Channel) -> str:
    assert channel.secret is not None  # the config requires one
    return channel.secret.decode()
