"""Email: a plain-text and an HTML part saying what Slack's message says, sent over SMTP.

:func:`render` is pure (the message's bytes); :func:`send` is the blocking SMTP exchange,
which the channel's sender runs in a thread. Every name and message from the training side is
HTML-escaped in the HTML part, and addresses are checked by the channels file, so nothing a
run is called can add a header or markup.
"""

from __future__ import annotations

import html
import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import formatdate

from trainvitals.server.notify.config import Channel, Smtp
from trainvitals.server.notify.text import (
    Message,
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

_SUBJECT_CHARS = 200
_EVIDENCE_ITEMS = 20
_EVIDENCE_VALUE_CHARS = 2000
_LINE_CHARS = 500
_COLOR = {"critical": "#d32f2f", "warning": "#f9a825", "info": "#1976d2"}


def render(
    channel: Channel, key: str, notices: Sequence[Notice], public_url: str | None
) -> Message:
    """The email that tells ``channel`` about ``notices``: one alert, or a group."""
    if len(notices) == 1 and notices[0].change == "fired":
        subject, text, markup = _alert(notices[0], public_url)
    else:
        subject, text, markup = _group(notices, public_url, channel.group_max)
    return Message(key, _compose(channel, key, subject, text, markup))


def probe(channel: Channel, key: str, text: str) -> Message:
    """``notify-test``'s email."""
    return Message(key, _compose(channel, key, "trainvitals test message", text, _p(text)))


def send(smtp: Smtp, message: Message, timeout: float) -> None:
    """Deliver ``message`` (blocking). Raises :mod:`smtplib`'s exceptions, or ``OSError`` for
    the network; STARTTLS is required when ``smtp.starttls``: a server that does not offer it
    is refused, never written to in clear."""
    with smtplib.SMTP(smtp.host, smtp.port, timeout=timeout) as client:
        client.ehlo()
        if smtp.starttls:
            client.starttls(context=ssl.create_default_context())
            client.ehlo()
        if smtp.username is not None and smtp.password is not None:
            client.login(smtp.username, smtp.password)
        client.sendmail(smtp.sender, list(smtp.recipients), message.body)


def _alert(notice: Notice, public_url: str | None) -> tuple[str, str, str]:
    alert = notice.alert
    url = run_url(public_url, alert.run_id)
    evidence = evidence_lines(alert.evidence, _EVIDENCE_ITEMS, _EVIDENCE_VALUE_CHARS)
    text = [title(alert), "", alert.message, ""]
    text += [f"{name}: {value}" for name, value in facts(alert)]
    if alert.hint:
        text += ["", "What to do:", alert.hint]
    if evidence:
        text += ["", "Evidence:", *(f"  {e}" for e in evidence)]
    if url:
        text += ["", f"Open the run: {url}"]
    color = _COLOR.get(alert.severity, "#444")
    rows = "".join(
        f'<tr><th align="left" style="padding-right:1em">{_e(name)}</th><td>{_e(value)}</td></tr>'
        for name, value in facts(alert)
    )
    markup = [
        f'<h2 style="color:{color}">{_e(title(alert))}</h2>',
        f"<p><strong>{_e(alert.message)}</strong></p>",
        f"<table>{rows}</table>",
    ]
    if alert.hint:
        markup += ["<h3>What to do</h3>", _p(alert.hint)]
    if evidence:
        markup += ["<h3>Evidence</h3>", f"<pre>{_e(chr(10).join(evidence))}</pre>"]
    if url:
        markup.append(f'<p><a href="{_e(url)}">Open the run</a></p>')
    return cut(summary(notice), _SUBJECT_CHARS), "\n".join(text), "\n".join(markup)


def _group(notices: Sequence[Notice], public_url: str | None, lines: int) -> tuple[str, str, str]:
    """A resolution, a group, or past ``lines`` changes a digest (as Slack's)."""
    heading = summary(notices[0]) if len(notices) == 1 else group_title(notices)
    text, markup = [heading, ""], [f"<h2>{_e(heading)}</h2>"]
    if len(notices) > lines:
        said = digest_lines(notices)
        text += [*said, ""]
        markup += [_p(s) for s in said]
    items = []
    for notice in notices[:lines]:
        url = run_url(public_url, notice.alert.run_id)
        one = line(notice, _LINE_CHARS)
        text.append(f"- {one}" + (f"\n  {url}" if url else ""))
        items.append(
            f'<li>{_e(one)} <a href="{_e(url)}">run</a></li>' if url else f"<li>{_e(one)}</li>"
        )
    markup.append(f"<ul>{''.join(items)}</ul>")
    if len(notices) > lines:
        page = alerts_url(public_url)
        more = f"… and {len(notices) - lines:,} more on the alerts page"
        text.append(more + (f": {page}" if page else ""))
        markup.append(f'<p><a href="{_e(page)}">{_e(more)}</a></p>' if page else _p(more))
    return cut(heading, _SUBJECT_CHARS), "\n".join(text), "\n".join(markup)


def _compose(channel: Channel, key: str, subject: str, text: str, markup: str) -> bytes:
    assert channel.smtp is not None  # an email channel has its server
    mail = EmailMessage(policy=SMTP)
    # A subject is one line: a message with a newline must not start a header of its own.
    mail["Subject"] = " ".join(subject.split())
    mail["From"] = channel.smtp.sender
    mail["To"] = ", ".join(channel.smtp.recipients)
    mail["Date"] = formatdate(localtime=False)
    mail["Message-ID"] = f"<{key}@trainvitals>"
    mail["X-Trainvitals-Delivery"] = key
    mail.set_content(text + "\n")
    mail.add_alternative(
        f'<!doctype html><html><body style="font-family:sans-serif">{markup}</body></html>\n',
        subtype="html",
    )
    return mail.as_bytes()


def _p(text: str) -> str:
    return f"<p>{_e(text)}</p>".replace("\n", "<br>")


def _e(text: str) -> str:
    return html.escape(text, quote=True)
