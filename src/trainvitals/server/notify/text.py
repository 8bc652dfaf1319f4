"""What every channel says about an alert change, in plain words (pure, no markup).

A :class:`Notice` is one alert change waiting for one channel (a row of the outbox). Each
channel kind (Slack, email, Teams, Discord, PagerDuty) lays these words out in its own
format and escapes them for it; the words, the cuts and a storm's counts are made here once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from trainvitals.detect import Alert

NoticeChange = Literal["fired", "resolved"]
#: A JSON value, as messages carry an alert's evidence.
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]

#: Rules and projects a digest counts by name; the rest are summed.
DIGEST_KINDS = 6


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
    """A rendered message: its delivery key and body (JSON to POST, or an email's bytes)."""

    key: str
    body: bytes


def run_url(public_url: str | None, run_id: str) -> str | None:
    """The dashboard's page of a run, when the server's public URL is known."""
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/#/runs/{quote(run_id, safe='')}"


def alerts_url(public_url: str | None) -> str | None:
    """The dashboard's alerts page, when the server's public URL is known."""
    return f"{public_url.rstrip('/')}/#/alerts" if public_url else None


def where(alert: Alert) -> str:
    return f"{alert.project}/{alert.run_name}"


def title(alert: Alert) -> str:
    """``CRITICAL: nonfinite on lr-3e-4``."""
    return f"{alert.severity.upper()}: {alert.rule} on {alert.run_name}"


def summary(notice: Notice) -> str:
    """One sentence: ``[CRITICAL] nonfinite on mnist/lr-3e-4: Loss is NaN at step 50``."""
    alert = notice.alert
    if notice.change == "resolved":
        return f"Resolved: {alert.rule} on {where(alert)}"
    return f"[{alert.severity.upper()}] {alert.rule} on {where(alert)}: {alert.message}"


def line(notice: Notice, message_chars: int) -> str:
    """A group's line for one change (without the run's link)."""
    alert = notice.alert
    message = cut(alert.message, message_chars)
    if notice.change == "resolved":
        return f"Resolved: {alert.rule} on {where(alert)}: {message}"
    return (
        f"{alert.severity.upper()} {alert.rule} on {where(alert)} at step {alert.step}: {message}"
    )


def facts(alert: Alert) -> list[tuple[str, str]]:
    """The fields of a firing alert, in the order every channel shows them."""
    rule = alert.rule + (f" ({alert.subject})" if alert.subject else "")
    return [
        ("Severity", alert.severity.upper()),
        ("Project", alert.project),
        ("Run", alert.run_name),
        ("Rule", rule),
        ("Step", str(alert.step)),
    ]


def evidence_lines(evidence: Mapping[str, Any], items: int, value_chars: int) -> list[str]:
    """The first ``items`` evidence values, one a line, each cut short (stacks are long)."""
    lines = []
    for name, value in list(evidence.items())[:items]:
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        lines.append(f"{name}: {cut(text, value_chars)}")
    if len(evidence) > items:
        lines.append(f"... and {len(evidence) - items} more on the run page")
    return lines


def group_title(notices: Sequence[Notice]) -> str:
    """``12 alert changes in trainvitals (11 fired, 1 resolved)``."""
    fired = sum(n.change == "fired" for n in notices)
    resolved = len(notices) - fired
    pairs = ((fired, "fired"), (resolved, "resolved"))
    counts = ", ".join(f"{n:,} {word}" for n, word in pairs if n)
    return f"{len(notices):,} alert changes in trainvitals ({counts})"


def digest_lines(
    notices: Sequence[Notice],
    code: Callable[[str], str] = str,
    escape: Callable[[str], str] = str,
) -> list[str]:
    """A storm in two lines: ``1,200 CRITICAL crash · ...`` and ``1,200 runs · projects: ...``,
    with ``code`` marking rule names and ``escape`` quoting project names for the format."""
    rules = Counter((n.alert.severity, n.alert.rule, n.change) for n in notices)
    by_rule = " · ".join(
        f"{count:,} {severity.upper()} {code(rule)}" + (" resolved" if change == "resolved" else "")
        for (severity, rule, change), count in rules.most_common(DIGEST_KINDS)
    )
    projects = Counter(n.alert.project for n in notices)
    named = ", ".join(
        f"{escape(project)} ({n:,})" for project, n in projects.most_common(DIGEST_KINDS)
    )
    if len(projects) > DIGEST_KINDS:
        named += f" and {len(projects) - DIGEST_KINDS:,} more"
    runs = len({n.alert.run_id for n in notices})
    return [by_rule, f"{runs:,} runs · projects: {named}"]


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
