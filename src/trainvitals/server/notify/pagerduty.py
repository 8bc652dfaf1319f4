"""PagerDuty Events API v2: an alert ``trigger``\\s an incident, its resolution ``resolve``\\s it.

Each alert is one PagerDuty alert: its id is the event's ``dedup_key``, so a retried trigger
is one incident, and the resolve names the incident it closes. The routing key (the
channel's secret) travels in the body, which is never logged.
See https://developer.pagerduty.com/docs/events-api-v2/trigger-events/.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, NotRequired, TypedDict

from trainvitals.server.notify.config import Channel
from trainvitals.server.notify.text import JSONValue, Notice, cut, run_url, summary

# PagerDuty's limits: summary 1024 characters, dedup_key 255, the whole event 512 KB.
_SUMMARY_CHARS = 1024
_DEDUP_CHARS = 255
_DETAIL_VALUE_CHARS = 4000
#: Our severities in PagerDuty's words (it also has ``error``, which we do not use).
_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


class Details(TypedDict):
    """The alert as the incident's custom details show it."""

    message: str
    what_to_do: str
    rule: str
    subject: str
    project: str
    run: str
    run_id: str
    step: int
    evidence: dict[str, JSONValue]


#: What the incident shows (``class`` is no Python name: the functional form).
Payload = TypedDict(
    "Payload",
    {
        "summary": str,
        "severity": str,
        "source": str,
        "component": NotRequired[str],
        "group": NotRequired[str],
        "class": NotRequired[str],
        "timestamp": NotRequired[str],
        "custom_details": NotRequired[Details],
    },
)


class Link(TypedDict):
    href: str
    text: str


class Event(TypedDict):
    """One event of the Events API v2: a ``trigger`` carries the payload, a ``resolve`` not."""

    routing_key: str
    dedup_key: str
    event_action: Literal["trigger", "resolve"]
    client: NotRequired[str]
    payload: NotRequired[Payload]
    client_url: NotRequired[str]
    links: NotRequired[list[Link]]


def event(channel: Channel, notice: Notice, public_url: str | None) -> Event:
    """The event that tells PagerDuty about one alert change."""
    alert = notice.alert
    out: Event = {
        "routing_key": _routing_key(channel),
        "dedup_key": cut(alert.id, _DEDUP_CHARS),
        "event_action": "resolve" if notice.change == "resolved" else "trigger",
    }
    if notice.change == "resolved":
        return out
    url = run_url(public_url, alert.run_id)
    details: Details = {
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
    out["client"] = "trainvitals"
    out["payload"] = {
        "summary": cut(summary(notice), _SUMMARY_CHARS),
        "severity": _SEVERITY.get(alert.severity, "warning"),
        "source": f"{alert.project}/{alert.run_name}",
        "component": alert.run_name,
        "group": alert.project,
        "class": alert.rule,
        "timestamp": datetime.fromtimestamp(alert.time, UTC).isoformat(),
        "custom_details": details,
    }
    if url:
        out["client_url"] = url
        out["links"] = [{"href": url, "text": "Open the run in trainvitals"}]
    return out


def probe(channel: Channel, key: str, text: str) -> Event:
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
