"""Email: a plain-text and an HTML part (names escaped) sent to a real SMTP server, with
login, STARTTLS required by default, and SMTP's answers mapped to retry or give up."""

from __future__ import annotations

import asyncio
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.notify import Mailbox, mail_receiving
from tests.server.notify.test_messages import notice
from trainvitals.cli import main
from trainvitals.server.notify import Channel
from trainvitals.server.notify.config import Smtp
from trainvitals.server.notify.delivery import Outcome, post
from trainvitals.server.notify.messages import Message, render

PUBLIC_URL = "https://tv.example.org"


def channel(
    mailbox: Mailbox, starttls: bool = False, login: tuple[str, str] | None = None
) -> Channel:
    user, password = login or (None, None)
    smtp = Smtp(
        "127.0.0.1", mailbox.port, starttls, "tv@example.org", ("a@example.org", "b@example.org"),
        user, password,
    )  # fmt: skip
    return Channel("mail", "email", f"smtp://127.0.0.1:{mailbox.port}", smtp=smtp, timeout=5)


def send(target: Channel, message: Message) -> Outcome:
    async def attempt() -> Outcome:
        async with httpx.AsyncClient() as client:
            return await post(client, target, message)

    return asyncio.run(attempt())


def parts(mail: EmailMessage) -> tuple[str, str]:
    text, markup = (mail.get_body((kind,)) for kind in ("plain", "html"))
    assert isinstance(text, EmailMessage) and isinstance(markup, EmailMessage)
    return text.get_content().replace("\r\n", "\n"), markup.get_content()


def test_an_alert_is_an_email_with_what_slack_says_its_names_escaped() -> None:
    hostile: dict[str, Any] = {
        "run_name": "<script>alert(1)</script>", "message": "Loss is NaN\nBcc: x@evil",
        "severity": "critical", "evidence": {"loss": "nan", "where": "<b>"},
    }  # fmt: skip
    with mail_receiving() as mailbox:
        target = channel(mailbox)
        outcome = send(target, render(target, [notice(**hostile)], PUBLIC_URL))
        (mail,) = mailbox.wait(1)
    assert outcome.accepted, outcome.detail
    assert mailbox.envelopes == [("tv@example.org", ["a@example.org", "b@example.org"])]
    assert mail["Subject"].strip() == (  # a long subject is folded
        "[CRITICAL] stall on mnist/<script>alert(1)</script>: Loss is NaN Bcc: x@evil"
    )
    assert mail["Bcc"] is None and mail["X-Trainvitals-Delivery"] == "n1"
    assert mail["Message-ID"] == "<n1@trainvitals>"
    text, markup = parts(mail)
    for said in (
        "Severity: CRITICAL",
        "Rule: stall",
        "What to do:\nLook at the stacks",
        "Evidence:\n  loss: nan",
        "Open the run: https://tv.example.org/#/runs/run%2F1",
    ):
        assert said in text
    assert "<script>" not in markup and "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert "where: &lt;b&gt;" in markup and "<h3>What to do</h3>" in markup
    assert '<a href="https://tv.example.org/#/runs/run%2F1">Open the run</a>' in markup


def test_a_group_is_one_email_listing_each_change() -> None:
    with mail_receiving() as mailbox:
        target = channel(mailbox)
        group = [notice(id="1"), notice("resolved", id="2"), notice(id="3", run_id="r3")]
        assert send(target, render(target, group, PUBLIC_URL)).accepted
        (mail,) = mailbox.wait(1)
    assert mail["Subject"].strip() == "3 alert changes in trainvitals (2 fired, 1 resolved)"
    text, markup = parts(mail)
    assert "- Resolved: stall on mnist/lr <3>" in text and markup.count("<li>") == 3
    assert "https://tv.example.org/#/runs/r3" in text


def test_login_and_smtps_answers_decide_retry_or_give_up() -> None:
    with mail_receiving(login=("bot", "pwSECRET")) as mailbox:
        good = channel(mailbox, login=("bot", "pwSECRET"))
        message = render(good, [notice()], None)
        assert send(good, message).accepted and mailbox.logins == ["bot"]
        refused = send(channel(mailbox, login=("bot", "wrong")), message)
        assert (refused.accepted, refused.retry, refused.status) == (False, False, 535)
        mailbox.replies += ["451 4.3.0 try again later", "554 5.6.0 rejected"]
        later = send(good, message)
        assert (later.retry, later.detail) == (True, "SMTP 451 4.3.0 try again later")
        assert send(good, message).retry is False
        assert len(mailbox.messages) == 1
        # STARTTLS is the default: a server without it is never sent a password in clear.
        logins = len(mailbox.logins)
        clear = send(channel(mailbox, starttls=True, login=("bot", "pwSECRET")), message)
        assert not clear.accepted and not clear.retry and "STARTTLS" in clear.detail
        assert len(mailbox.logins) == logins and "SECRET" not in clear.detail + refused.detail
    gone = send(good, message)  # nobody listens any more: retried
    assert gone.retry and "ConnectionRefusedError" in gone.detail


def test_notify_test_sends_an_email_through_the_same_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mail_receiving() as mailbox:
        path = tmp_path / "channels.toml"
        path.write_text(
            '[[channels]]\nname = "mail"\nkind = "email"\nsmtp_host = "127.0.0.1"\n'
            f'smtp_port = {mailbox.port}\nstarttls = false\nfrom = "tv@example.org"\n'
            'to = ["a@example.org"]\n'
        )
        assert main(["notify-test", "--channel", "mail", "--notify", str(path)]) == 0
        (mail,) = mailbox.wait(1)
    assert "OK: channel 'mail' (email, smtp://127.0.0.1) accepted" in capsys.readouterr().out
    assert mail["Subject"] == "trainvitals test message"
    assert "trainvitals test message for channel 'mail'" in parts(mail)[0]
