"""What a channel is sent: Slack Block Kit messages, signed JSON webhooks, and through
their own modules PagerDuty events, emails, Teams and Discord messages (pure, no I/O).

A :class:`Notice` is one alert change waiting for one channel (a row of the outbox). One
notice renders as a message of its own; several that waited together (an alert storm)
render as one grouped message (PagerDuty excepted: one event per alert). Every message has
a delivery key, sent as the ``X-Trainvitals-Delivery`` header: the notice's id, or for a
group a digest of its notices' ids, the same on every retry, so a receiver can drop what it
has already taken.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

from trainvitals.detect.types import jsonable
from trainvitals.exceptions import ConfigurationError
from trainvitals.server.notify import chat, mail, pagerduty
from trainvitals.server.notify.config import Channel
from trainvitals.server.notify.text import (
    JSONValue,
    Message,
    Notice,
    NoticeChange,
    alerts_url,
    cut,
    digest_lines,
    evidence_lines,
    facts,
    group_title,
    run_url,
    summary,
    title,
)

__all__ = [
    "Message",
    "Notice",
    "NoticeChange",
    "headers",
    "probe_message",
    "render",
    "run_url",
    "sign",
    "verify_signature",
]

#: Webhook body version; receivers should check it.
WEBHOOK_VERSION = 1
#: Seconds a receiver should accept a signature's timestamp either side of its clock.
REPLAY_WINDOW = 300.0

DELIVERY_HEADER = "X-Trainvitals-Delivery"
TIMESTAMP_HEADER = "X-Trainvitals-Timestamp"
SIGNATURE_HEADER = "X-Trainvitals-Signature"

# Slack's limits: header text 150 characters, section text 3000, field text 2000, 50 blocks.
_HEADER_CHARS = 150
_SECTION_CHARS = 2900
_EVIDENCE_ITEMS = 8
_EVIDENCE_VALUE_CHARS = 160
_GROUP_LINE_CHARS = 280

_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


class PlainText(TypedDict):
    type: Literal["plain_text"]
    text: str


class Mrkdwn(TypedDict):
    type: Literal["mrkdwn"]
    text: str


class Header(TypedDict):
    type: Literal["header"]
    text: PlainText


class Section(TypedDict):
    type: Literal["section"]
    text: NotRequired[Mrkdwn]
    fields: NotRequired[list[Mrkdwn]]


class Button(TypedDict):
    type: Literal["button"]
    text: PlainText
    url: str


class Actions(TypedDict):
    type: Literal["actions"]
    elements: list[Button]


class SlackMessage(TypedDict):
    """A Block Kit message; ``text`` is what notifications (phones, screen readers) show."""

    text: str
    blocks: list[Header | Section | Actions]


class WebhookItem(TypedDict):
    delivery: str
    change: NoticeChange
    alert: dict[str, JSONValue]
    run_url: str | None


class WebhookAlerts(TypedDict):
    """A generic webhook's body: the alert changes of one delivery."""

    version: int
    type: Literal["alerts"]
    delivery: str
    items: list[WebhookItem]


class WebhookProbe(TypedDict):
    version: int
    type: Literal["test"]
    delivery: str
    channel: str
    message: str


#: Every JSON body a channel is sent.
Payload = SlackMessage | WebhookAlerts | WebhookProbe | chat.ChatMessage | pagerduty.Event


def render(channel: Channel, notices: Sequence[Notice], public_url: str | None) -> Message:
    """The message that tells ``channel`` about ``notices`` (one, or a group)."""
    if not notices:
        raise ConfigurationError("Expected at least one notice to render, but got none")
    key = notices[0].id if len(notices) == 1 else _group_key(notices)
    if channel.kind == "email":
        return mail.render(channel, key, notices, public_url)
    payload: Payload
    if channel.kind == "pagerduty":
        (notice,) = notices  # the sender does not group them
        payload = pagerduty.event(channel, notice, public_url)
    elif channel.kind in ("teams", "discord"):
        payload = chat.render(channel.kind, notices, public_url, channel.group_max)
    elif channel.kind == "slack":
        payload = _slack(notices, public_url, channel.group_max)
    else:
        payload = {
            "version": WEBHOOK_VERSION,
            "type": "alerts",
            "delivery": key,
            "items": [
                {
                    "delivery": n.id,
                    "change": n.change,
                    "alert": jsonable(n.alert.as_dict()),
                    "run_url": run_url(public_url, n.alert.run_id),
                }
                for n in notices
            ],
        }
    return Message(key, _dumps(payload))


def probe_message(channel: Channel, public_url: str | None) -> Message:
    """What ``trainvitals notify-test`` sends: harmless, and says where it came from."""
    key = f"test-{uuid.uuid4().hex}"
    origin = public_url or "a trainvitals server"
    text = f"trainvitals test message for channel {channel.name!r} from {origin}: it works."
    if channel.kind == "email":
        return mail.probe(channel, key, text)
    payload: Payload
    if channel.kind == "pagerduty":
        payload = pagerduty.probe(channel, key, text)
    elif channel.kind in ("teams", "discord"):
        payload = chat.probe(channel.kind, text)
    elif channel.kind == "slack":
        payload = {
            "text": text,
            "blocks": [_section(f":white_check_mark: {_escape(text)}")],
        }
    else:
        payload = {
            "version": WEBHOOK_VERSION,
            "type": "test",
            "delivery": key,
            "channel": channel.name,
            "message": text,
        }
    return Message(key, _dumps(payload))


def headers(channel: Channel, message: Message, now: float | None = None) -> dict[str, str]:
    """The request headers for one attempt: the delivery key, and for a webhook with a
    secret a fresh timestamp and its signature (re-signed on every retry, so a retry late
    in the backoff still falls inside the receiver's replay window)."""
    out = {"Content-Type": "application/json", DELIVERY_HEADER: message.key}
    if channel.kind == "webhook" and channel.secret is not None:
        timestamp = str(int(time.time() if now is None else now))
        out[TIMESTAMP_HEADER] = timestamp
        out[SIGNATURE_HEADER] = sign(channel.secret, timestamp, message.body)
    return out


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of ``f"{timestamp}.{body}"`` under ``secret``."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_signature(
    secret: bytes | str,
    timestamp: str,
    body: bytes,
    signature: str,
    now: float | None = None,
    tolerance: float = REPLAY_WINDOW,
) -> bool:
    """Whether a webhook request is genuine and fresh: the signature matches the timestamp
    and body, and the timestamp is within ``tolerance`` seconds of ``now``.

    Example:
        ```python
        ok = verify_signature(
            os.environ["TRAINVITALS_WEBHOOK_SECRET"],
            request.headers["X-Trainvitals-Timestamp"],
            await request.body(),
            request.headers["X-Trainvitals-Signature"],
        )
        ```
    """
    key = secret.encode() if isinstance(secret, str) else secret
    try:
        age = abs((time.time() if now is None else now) - int(timestamp))
    except ValueError:
        return False
    return age <= tolerance and hmac.compare_digest(sign(key, timestamp, body), signature)


# -- Slack ---------------------------------------------------------------------------------


def _slack(notices: Sequence[Notice], public_url: str | None, lines: int) -> SlackMessage:
    if len(notices) > lines:
        return _slack_digest(notices, public_url, lines)
    if len(notices) > 1:
        return _slack_group(notices, public_url)
    notice = notices[0]
    if notice.change == "resolved":
        one = _one_line(notice, public_url)
        return {"text": _plain_summary(notice), "blocks": [_section(one)]}
    return _slack_alert(notice, public_url)


def _slack_alert(notice: Notice, public_url: str | None) -> SlackMessage:
    alert = notice.alert
    url = run_url(public_url, alert.run_id)
    run = _escape(alert.run_name)
    fields = [(name, _escape(value)) for name, value in facts(alert)]
    fields[2] = ("Run", f"<{url}|{run}>" if url else run)
    fields[3] = (
        "Rule",
        f"`{alert.rule}`" + (f" ({_escape(alert.subject)})" if alert.subject else ""),
    )
    emoji = _EMOJI.get(alert.severity, "")
    header = f"{emoji} {title(alert)}"
    blocks: list[Header | Section | Actions] = [
        _header(header),
        _section(f"*{_escape(alert.message)}*"),
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{name}*\n{value}"} for name, value in fields],
        },
    ]
    evidence = _evidence(alert.evidence)
    if evidence:
        blocks.append(_section(f"*Evidence*\n```{evidence}```"))
    if alert.hint:
        blocks.append(_section(f"*What to do*\n{_escape(alert.hint)}"))
    if url:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open the run"},
                        "url": url,
                    }
                ],
            }
        )
    return {"text": _plain_summary(notice), "blocks": blocks}


def _slack_group(notices: Sequence[Notice], public_url: str | None) -> SlackMessage:
    header = group_title(notices)
    blocks: list[Header | Section | Actions] = [_header(header)]
    blocks += [_section(_one_line(n, public_url)) for n in notices]
    return {"text": header, "blocks": blocks}


def _slack_digest(notices: Sequence[Notice], public_url: str | None, lines: int) -> SlackMessage:
    """A storm in one message: counts by rule and by project, the first ``lines`` changes,
    and where to see the rest (a flood of runs must not page a channel once per run)."""
    header = group_title(notices)
    by_rule, runs = digest_lines(notices, code=lambda rule: f"`{rule}`", escape=_escape)
    rest = len(notices) - lines
    alerts_page = alerts_url(public_url)
    more = f"… and {rest:,} more" + (f" on <{alerts_page}|the alerts page>" if alerts_page else "")
    blocks: list[Header | Section | Actions] = [
        _header(header),
        _section(f"*{by_rule}*\n{runs}"),
        *(_section(_one_line(n, public_url)) for n in notices[:lines]),
        _section(more),
    ]
    return {"text": header, "blocks": blocks}


def _one_line(notice: Notice, public_url: str | None) -> str:
    alert = notice.alert
    url = run_url(public_url, alert.run_id)
    run = _escape(f"{alert.project}/{alert.run_name}")
    where = f"<{url}|{run}>" if url else run
    message = cut(_escape(alert.message), _GROUP_LINE_CHARS)
    if notice.change == "resolved":
        return f":white_check_mark: *Resolved:* `{alert.rule}` on {where}: {message}"
    emoji = _EMOJI.get(alert.severity, "")
    severity = alert.severity.upper()
    return f"{emoji} *{severity}* `{alert.rule}` on {where} at step {alert.step}: {message}"


def _plain_summary(notice: Notice) -> str:
    """The notification text (phones, screen readers): the blocks are not shown there."""
    return cut(_escape(summary(notice)), _SECTION_CHARS)


def _evidence(evidence: Mapping[str, Any]) -> str:
    lines = evidence_lines(evidence, _EVIDENCE_ITEMS, _EVIDENCE_VALUE_CHARS)
    # A backtick would end the code block.
    return _escape("\n".join(lines).replace("`", "'"))


def _header(text: str) -> Header:
    return {"type": "header", "text": {"type": "plain_text", "text": cut(text, _HEADER_CHARS)}}


def _section(text: str) -> Section:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut(text, _SECTION_CHARS)}}


def _escape(text: str) -> str:
    """Slack's mrkdwn control characters, so names and messages show as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _group_key(notices: Sequence[Notice]) -> str:
    ids = ",".join(n.id for n in notices)
    return "g-" + hashlib.sha256(ids.encode()).hexdigest()[:32]


def _dumps(payload: Payload) -> bytes:
    # Alerts are stored with allow_nan=False, so their evidence is plain JSON already.
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
