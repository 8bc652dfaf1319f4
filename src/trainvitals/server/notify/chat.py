"""Microsoft Teams and Discord incoming webhooks (pure: the JSON each one takes).

Teams gets an Adaptive Card in a ``message`` (what a Teams Workflows "post to a channel when
a webhook request is received" flow and the older Office 365 connectors both take); Discord
gets an embed, with mentions switched off, so a run named ``@everyone`` pings nobody.
Groups and digests read as Slack's do: a title and one line per alert change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

from trainvitals.server.notify.text import (
    Notice,
    alerts_url,
    cut,
    digest_lines,
    evidence_lines,
    facts,
    group_title,
    line,
    run_url,
    summary,
    title,
)

ChatKind = Literal["teams", "discord"]


class TextBlock(TypedDict):
    type: Literal["TextBlock"]
    text: str
    wrap: bool
    weight: NotRequired[str]
    size: NotRequired[str]
    color: NotRequired[str]
    fontType: NotRequired[str]


class Fact(TypedDict):
    title: str
    value: str


class FactSet(TypedDict):
    type: Literal["FactSet"]
    facts: list[Fact]


class OpenUrl(TypedDict):
    type: Literal["Action.OpenUrl"]
    title: str
    url: str


#: A Teams Adaptive Card (``$schema`` is no Python name: the functional form).
AdaptiveCard = TypedDict(
    "AdaptiveCard",
    {
        "$schema": str,
        "type": Literal["AdaptiveCard"],
        "version": str,
        "msteams": dict[str, str],
        "body": list[TextBlock | FactSet],
        "actions": NotRequired[list[OpenUrl]],
    },
)


class CardAttachment(TypedDict):
    contentType: str
    contentUrl: None
    content: AdaptiveCard


class TeamsMessage(TypedDict):
    type: Literal["message"]
    attachments: list[CardAttachment]


class EmbedField(TypedDict):
    name: str
    value: str
    inline: bool


class Embed(TypedDict):
    title: str
    description: str
    color: NotRequired[int]
    fields: NotRequired[list[EmbedField]]
    url: NotRequired[str]


class AllowedMentions(TypedDict):
    parse: list[str]


class DiscordMessage(TypedDict):
    username: str
    content: str
    embeds: list[Embed]
    allowed_mentions: AllowedMentions


ChatMessage = TeamsMessage | DiscordMessage

_EVIDENCE_ITEMS = 8
_EVIDENCE_VALUE_CHARS = 160
_LINE_CHARS = 280
# Discord's limits: content 2000, title 256, description 4096, a field's value 1024,
# 6000 characters in all the embeds of a message.
_DISCORD_CONTENT = 2000
_DISCORD_TITLE = 256
_DISCORD_DESCRIPTION = 3500
_DISCORD_FIELD = 1000
_DISCORD_COLOR = {"critical": 0xD32F2F, "warning": 0xF9A825, "info": 0x1976D2}
_RESOLVED_COLOR = 0x2E7D32
# Teams takes up to about 28 KB a message; a card's text blocks are cut well below it.
_TEAMS_TEXT = 3000
_TEAMS_COLOR = {"critical": "Attention", "warning": "Warning", "info": "Accent"}


def render(
    kind: ChatKind, notices: Sequence[Notice], public_url: str | None, lines: int
) -> ChatMessage:
    """One alert change in full, or a group (past ``lines`` changes, a digest)."""
    if len(notices) == 1 and notices[0].change == "fired":
        if kind == "teams":
            return _teams_alert(notices[0], public_url)
        return _discord_alert(notices[0], public_url)
    heading, body, link = _group(notices, public_url, lines)
    if kind == "teams":
        blocks = [_text(heading, bold=True), *(_text(text) for text in body)]
        return _teams_card(blocks, link, "Open the run" if len(notices) == 1 else "Open alerts")
    embed: Embed = {
        "title": cut(_discord_escape(heading), _DISCORD_TITLE),
        "description": cut("\n".join(_discord_escape(text) for text in body), _DISCORD_DESCRIPTION),
    }
    if len(notices) == 1:
        embed["color"] = _RESOLVED_COLOR
    if link:
        embed["url"] = link
    return _discord_message(heading, [embed])


def probe(kind: ChatKind, text: str) -> ChatMessage:
    """``notify-test``'s message."""
    if kind == "teams":
        return _teams_card([_text(text)], None, "")
    return _discord_message(text, [])


def _group(
    notices: Sequence[Notice], public_url: str | None, lines: int
) -> tuple[str, list[str], str | None]:
    """A resolution, a group or a digest: its heading, its lines and where to look."""
    if len(notices) == 1:
        notice = notices[0]
        return (
            summary(notice),
            [line(notice, _LINE_CHARS)],
            run_url(public_url, notice.alert.run_id),
        )
    body = []
    if len(notices) > lines:
        body += digest_lines(notices)
    body += [line(n, _LINE_CHARS) for n in notices[:lines]]
    if len(notices) > lines:
        body.append(f"… and {len(notices) - lines:,} more on the alerts page")
    return group_title(notices), body, alerts_url(public_url)


# -- Teams ----------------------------------------------------------------------------------


def _teams_alert(notice: Notice, public_url: str | None) -> TeamsMessage:
    alert = notice.alert
    heading = _text(title(alert), bold=True)
    heading["size"], heading["color"] = "Medium", _TEAMS_COLOR.get(alert.severity, "Default")
    blocks: list[TextBlock | FactSet] = [
        heading,
        _text(alert.message),
        {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in facts(alert)]},
    ]
    evidence = evidence_lines(alert.evidence, _EVIDENCE_ITEMS, _EVIDENCE_VALUE_CHARS)
    if evidence:
        monospace = _text("\n\n".join(evidence))
        monospace["fontType"] = "Monospace"
        blocks += [_text("Evidence", bold=True), monospace]
    if alert.hint:
        blocks += [_text("What to do", bold=True), _text(alert.hint)]
    return _teams_card(blocks, run_url(public_url, alert.run_id), "Open the run")


def _teams_card(
    blocks: Sequence[TextBlock | FactSet], link: str | None, label: str
) -> TeamsMessage:
    card: AdaptiveCard = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "msteams": {"width": "Full"},
        "body": list(blocks),
    }
    if link:
        card["actions"] = [{"type": "Action.OpenUrl", "title": label, "url": link}]
    return {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }


def _text(text: str, bold: bool = False) -> TextBlock:
    block: TextBlock = {"type": "TextBlock", "text": cut(text, _TEAMS_TEXT), "wrap": True}
    if bold:
        block["weight"] = "Bolder"
    return block


# -- Discord --------------------------------------------------------------------------------


def _discord_alert(notice: Notice, public_url: str | None) -> DiscordMessage:
    alert = notice.alert
    url = run_url(public_url, alert.run_id)
    fields: list[EmbedField] = [
        {"name": name, "value": cut(_discord_escape(value), _DISCORD_FIELD) or "-", "inline": True}
        for name, value in facts(alert)
    ]
    evidence = evidence_lines(alert.evidence, _EVIDENCE_ITEMS, _EVIDENCE_VALUE_CHARS)
    if evidence:
        code = cut("\n".join(evidence).replace("`", "'"), _DISCORD_FIELD - 8)
        fields.append({"name": "Evidence", "value": f"```\n{code}\n```", "inline": False})
    if alert.hint:
        fields.append(
            {
                "name": "What to do",
                "value": cut(_discord_escape(alert.hint), _DISCORD_FIELD),
                "inline": False,
            }
        )
    embed: Embed = {
        "title": cut(_discord_escape(title(alert)), _DISCORD_TITLE),
        "description": cut(_discord_escape(alert.message), _DISCORD_DESCRIPTION),
        "color": _DISCORD_COLOR.get(alert.severity, 0),
        "fields": fields,
    }
    if url:
        embed["url"] = url
    return _discord_message(summary(notice), [embed])


def _discord_message(content: str, embeds: list[Embed]) -> DiscordMessage:
    return {
        "username": "trainvitals",
        "content": cut(_discord_escape(content), _DISCORD_CONTENT),
        "embeds": embeds,
        "allowed_mentions": {"parse": []},
    }


def _discord_escape(text: str) -> str:
    """Discord's markdown characters, so names show as written and make no masked links."""
    for char in "\\*_~`|[]":
        text = text.replace(char, "\\" + char)
    return text
