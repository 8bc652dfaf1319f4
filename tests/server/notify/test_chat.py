"""Teams (an Adaptive Card) and Discord (an embed, mentions off): an alert in full, a group
and a digest as Slack's, names shown as written."""

from __future__ import annotations

import json
from typing import Any

from tests.server.notify.test_messages import notice
from trainvitals.server.notify import Channel
from trainvitals.server.notify.messages import probe_message, render

TEAMS = Channel("teams", "teams", "https://example.webhook.office.com/x")
DISCORD = Channel("discord", "discord", "https://discord.com/api/webhooks/1/x")


def body(channel: Channel, *notices: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(render(channel, notices, "https://tv.example.org").body)
    return out


def test_teams_gets_an_adaptive_card_with_facts_evidence_hint_and_link() -> None:
    message = body(TEAMS, notice(severity="critical"))
    (attachment,) = message["attachments"]
    assert message["type"] == "message"
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    texts = [b.get("text") for b in card["body"]]
    assert texts[0] == "CRITICAL: stall on lr <3>" and card["body"][0]["color"] == "Attention"
    assert texts[1] == "No step for 95 s" and "What to do" in texts and "Evidence" in texts
    facts = {f["title"]: f["value"] for f in card["body"][2]["facts"]}
    assert facts == {
        "Severity": "CRITICAL", "Project": "mnist", "Run": "lr <3>", "Rule": "stall",
        "Step": "1200",
    }  # fmt: skip
    assert card["actions"][0]["url"] == "https://tv.example.org/#/runs/run%2F1"


def test_discord_gets_an_embed_that_pings_nobody_and_escapes_markdown() -> None:
    message = body(DISCORD, notice(run_name="@everyone [click](https://evil)", hint="use *clip*"))
    assert message["allowed_mentions"] == {"parse": []}
    (embed,) = message["embeds"]
    assert embed["url"] == "https://tv.example.org/#/runs/run%2F1"
    assert embed["title"] == "WARNING: stall on @everyone \\[click\\](https://evil)"
    fields = {f["name"]: f["value"] for f in embed["fields"]}
    assert fields["Run"] == "@everyone \\[click\\](https://evil)"
    assert fields["What to do"] == "use \\*clip\\*" and fields["Evidence"].startswith("```")
    assert message["content"].startswith("\\[WARNING\\] stall on mnist/@everyone")


def test_groups_and_digests_read_as_slacks_within_discords_limits() -> None:
    group = body(DISCORD, notice(id="1"), notice("resolved", id="2"))
    assert group["embeds"][0]["title"] == "2 alert changes in trainvitals (1 fired, 1 resolved)"
    assert group["embeds"][0]["url"] == "https://tv.example.org/#/alerts"
    storm = [notice(id=str(i), run_id=f"r{i}", message="m" * 300) for i in range(600)]
    digest = body(DISCORD, *storm)
    description = digest["embeds"][0]["description"]
    assert description.startswith("600 WARNING stall\n600 runs · projects: mnist (600)")
    assert len(description) <= 3500 and len(json.dumps(digest)) < 6000
    teams = body(TEAMS, *storm)["attachments"][0]["content"]["body"]
    assert teams[0]["text"].startswith("600 alert changes") and len(teams) == 1 + 2 + 20 + 1
    resolved = body(TEAMS, notice("resolved"))["attachments"][0]["content"]
    assert resolved["body"][0]["text"] == "Resolved: stall on mnist/lr <3>"
    assert json.loads(probe_message(DISCORD, None).body)["content"].startswith("trainvitals test")
