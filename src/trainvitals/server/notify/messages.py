"""What a channel is sent: Slack Block Kit messages, signed JSON webhooks (pure, no I/O).

A :class:`Notice` is one alert change waiting for one channel (a row of the outbox). One
notice renders as a message of its own; several that waited together (an alert storm)
render as one grouped message. Every message has a delivery key, sent as the
``X-Trainvitals-Delivery`` header: the notice's id, or for a group a digest of its notices'
ids, the same on every retry, so a receiver can drop what it has already taken.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from trainvitals.detect import Alert
from trainvitals.detect.types import jsonable
from trainvitals.exceptions import ConfigurationError
from trainvitals.server.notify.config import Channel

NoticeChange = Literal["fired", "resolved"]

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
#: Rules and projects a digest counts by name; the rest are summed.
_DIGEST_KINDS = 6

_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


@dataclass(frozen=True)
class Notice:
    """One alert change (``fired`` or ``resolved``) waiting to be sent to one channel."""

    id: str
    channel: str
    change: NoticeChange
    alert: Alert
    created_at: float


@dataclass(frozen=True)
class Message:
    """A rendered message: its delivery key and JSON body, ready to POST."""

    key: str
    body: bytes


def render(channel: Channel, notices: Sequence[Notice], public_url: str | None) -> Message:
    """The message that tells ``channel`` about ``notices`` (one, or a group)."""
    if not notices:
        raise ConfigurationError("Expected at least one notice to render, but got none")
    key = notices[0].id if len(notices) == 1 else _group_key(notices)
    if channel.kind == "slack":
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
    if channel.kind == "slack":
        payload: dict[str, Any] = {
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


def run_url(public_url: str | None, run_id: str) -> str | None:
    """The dashboard's page of a run, when the server's public URL is known."""
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/#/runs/{quote(run_id, safe='')}"


# -- Slack ---------------------------------------------------------------------------------


def _slack(notices: Sequence[Notice], public_url: str | None, lines: int) -> dict[str, Any]:
    if len(notices) > lines:
        return _slack_digest(notices, public_url, lines)
    if len(notices) > 1:
        return _slack_group(notices, public_url)
    notice = notices[0]
    if notice.change == "resolved":
        line = _one_line(notice, public_url)
        return {"text": _plain_summary(notice), "blocks": [_section(line)]}
    return _slack_alert(notice, public_url)


def _slack_alert(notice: Notice, public_url: str | None) -> dict[str, Any]:
    alert = notice.alert
    url = run_url(public_url, alert.run_id)
    run = _escape(alert.run_name)
    fields = [
        ("Severity", alert.severity.upper()),
        ("Project", _escape(alert.project)),
        ("Run", f"<{url}|{run}>" if url else run),
        (
            "Rule",
            f"`{alert.rule}`" + (f" ({_escape(alert.subject)})" if alert.subject else ""),
        ),
        ("Step", str(alert.step)),
    ]
    emoji = _EMOJI.get(alert.severity, "")
    title = f"{emoji} {alert.severity.upper()}: {alert.rule} on {alert.run_name}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, _HEADER_CHARS)}},
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


def _slack_group(notices: Sequence[Notice], public_url: str | None) -> dict[str, Any]:
    title = _group_title(notices)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, _HEADER_CHARS)}}
    ]
    blocks += [_section(_one_line(n, public_url)) for n in notices]
    return {"text": title, "blocks": blocks}


def _slack_digest(notices: Sequence[Notice], public_url: str | None, lines: int) -> dict[str, Any]:
    """A storm in one message: counts by rule and by project, the first ``lines`` changes,
    and where to see the rest (a flood of runs must not page a channel once per run)."""
    title = _group_title(notices)
    rules = Counter((n.alert.severity, n.alert.rule, n.change) for n in notices)
    by_rule = " · ".join(
        f"{count:,} {severity.upper()} `{rule}`" + (" resolved" if change == "resolved" else "")
        for (severity, rule, change), count in rules.most_common(_DIGEST_KINDS)
    )
    projects = Counter(n.alert.project for n in notices)
    runs = len({n.alert.run_id for n in notices})
    where = ", ".join(
        f"{_escape(project)} ({count:,})" for project, count in projects.most_common(_DIGEST_KINDS)
    )
    if len(projects) > _DIGEST_KINDS:
        where += f" and {len(projects) - _DIGEST_KINDS:,} more"
    rest = len(notices) - lines
    alerts_page = f"{public_url.rstrip('/')}/#/alerts" if public_url else None
    more = f"… and {rest:,} more" + (f" on <{alerts_page}|the alerts page>" if alerts_page else "")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(title, _HEADER_CHARS)}},
        _section(f"*{by_rule}*\n{runs:,} runs · projects: {where}"),
        *(_section(_one_line(n, public_url)) for n in notices[:lines]),
        _section(more),
    ]
    return {"text": title, "blocks": blocks}


def _group_title(notices: Sequence[Notice]) -> str:
    fired = sum(n.change == "fired" for n in notices)
    resolved = len(notices) - fired
    pairs = ((fired, "fired"), (resolved, "resolved"))
    counts = ", ".join(f"{n:,} {word}" for n, word in pairs if n)
    return f"{len(notices):,} alert changes in trainvitals ({counts})"


def _one_line(notice: Notice, public_url: str | None) -> str:
    alert = notice.alert
    url = run_url(public_url, alert.run_id)
    run = _escape(f"{alert.project}/{alert.run_name}")
    where = f"<{url}|{run}>" if url else run
    message = _cut(_escape(alert.message), _GROUP_LINE_CHARS)
    if notice.change == "resolved":
        return f":white_check_mark: *Resolved:* `{alert.rule}` on {where}: {message}"
    emoji = _EMOJI.get(alert.severity, "")
    severity = alert.severity.upper()
    return f"{emoji} *{severity}* `{alert.rule}` on {where} at step {alert.step}: {message}"


def _plain_summary(notice: Notice) -> str:
    """The notification text (phones, screen readers): the blocks are not shown there."""
    alert = notice.alert
    where = f"{alert.project}/{alert.run_name}"
    where = _escape(where)
    if notice.change == "resolved":
        return _cut(f"Resolved: {alert.rule} on {where}", _SECTION_CHARS)
    return _cut(
        f"[{alert.severity.upper()}] {alert.rule} on {where}: {_escape(alert.message)}",
        _SECTION_CHARS,
    )


def _evidence(evidence: Mapping[str, Any]) -> str:
    """The first few evidence values, one a line, each cut short (stacks can be long)."""
    lines = []
    for name, value in list(evidence.items())[:_EVIDENCE_ITEMS]:
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        text = text.replace("`", "'")  # a backtick would end the code block
        lines.append(f"{name}: {_cut(text, _EVIDENCE_VALUE_CHARS)}")
    if len(evidence) > _EVIDENCE_ITEMS:
        lines.append(f"... and {len(evidence) - _EVIDENCE_ITEMS} more on the run page")
    return _escape("\n".join(lines))


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, _SECTION_CHARS)}}


def _escape(text: str) -> str:
    """Slack's mrkdwn control characters, so names and messages show as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _group_key(notices: Sequence[Notice]) -> str:
    ids = ",".join(n.id for n in notices)
    return "g-" + hashlib.sha256(ids.encode()).hexdigest()[:32]


def _dumps(payload: Mapping[str, Any]) -> bytes:
    # Alerts are stored with allow_nan=False, so their evidence is plain JSON already.
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
