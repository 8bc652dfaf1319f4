"""The channels file: routing, pace, secrets from the environment, and errors that name the
setting (never its value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainvitals.cli import main
from trainvitals.detect import Alert, Severity
from trainvitals.exceptions import NotifyError
from trainvitals.server.notify import Channel, NotifyConfig, load_notify

ENV = {"SLACK_URL": "https://hooks.slack.com/services/T1/B1/slackSECRET", "KEY": "keySECRET"}


def config(text: str, tmp_path: Path, environ: dict[str, str] | None = None) -> NotifyConfig:
    path = tmp_path / "channels.toml"
    path.write_text(text)
    return load_notify(path, ENV if environ is None else environ)


def test_channels_take_defaults_routing_and_secrets_from_the_environment(tmp_path: Path) -> None:
    notify = config(
        """
        [defaults]
        group_window = 5
        rate = 0.5

        [[channels]]
        name = "team"
        kind = "slack"
        url_env = "SLACK_URL"
        projects = ["mnist"]

        [[channels]]
        name = "pager"
        kind = "webhook"
        url = "https://ops.example.org/pathSECRET"
        secret = "${KEY}"
        min_severity = "critical"
        rate = 2
        """,
        tmp_path,
    )
    team, pager = notify.channels
    assert team.url == ENV["SLACK_URL"] and team.secret is None
    assert (team.group_window, team.rate, team.burst, team.min_severity) == (5.0, 0.5, 3, "warning")
    assert pager.secret == b"keySECRET" and pager.rate == 2.0 and pager.group_window == 5.0

    def routes(project: str, severity: Severity) -> list[Channel]:
        alert = Alert("a", "nonfinite", "", severity, "firing", "m", "h", 1, 1.0, 1.0)
        alert.project = project
        return [c for c in notify.channels if c.wants(alert)]

    assert routes("mnist", "warning") == [team]
    assert routes("gan", "critical") == [pager]
    assert routes("mnist", "info") == []
    assert notify.get("pager") is pager
    # What the API and the logs show: no URL path, no secret.
    shown = repr(notify) + repr([c.describe() for c in notify.channels])
    assert "SECRET" not in shown and "/services/" not in shown
    assert team.describe()["target"] == "https://hooks.slack.com"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[[channels]]\nname = "a"\nkind = "sms"\nurl = "https://x"\n', "kind: Input should be"),
        ('[[channels]]\nname = "a"\nkind = "email"\nurl = "https://x"\n', "takes no url"),
        ('[[channels]]\nname = "a"\nkind = "email"\nsmtp_host = "h"\nto = ["a@b"]\n', "needs from"),
        (
            '[[channels]]\nname = "a"\nkind = "email"\nsmtp_host = "h"\nfrom = "a@b"\n'
            'to = ["x@y\\nBcc: z@w"]\n',
            "plain addresses",
        ),
        ('[[channels]]\nname = "a"\nkind = "pagerduty"\n', "one of routing_key and"),
        (
            '[[channels]]\nname = "a"\nkind = "pagerduty"\nrouting_key_env = "NOPE"\n',
            "routing_key_env: the environment variable NOPE is not set",
        ),
        (
            '[[channels]]\nname = "a"\nkind = "slack"\nurl = "https://x"\nsmtp_host = "h"\n',
            "smtp_host is an email",
        ),
        (
            '[[channels]]\nname = "a"\nkind = "teams"\nurl = "https://x"\nstarttls = false\n',
            "starttls is an email",
        ),
        (
            '[[channels]]\nname = "a"\nkind = "discord"\nurl = "https://x"\nsecret = "k"\n',
            "no secret",
        ),
        ('[[channels]]\nname = "a"\nkind = "slack"\n', "exactly one of url and url_env"),
        ('[[channels]]\nname = "a"\nkind = "slack"\nurl_env = "NOPE"\n', "NOPE is not set"),
        ('[[channels]]\nname = "a"\nkind = "webhook"\nurl = "${NOPE}"\n', "NOPE is not set"),
        ('[[channels]]\nname = "a"\nkind = "webhook"\nurl = "ftp://x"\n', "http:// or https://"),
        ('[[channels]]\nname = "a"\nkind = "webhook"\nurl = "https://x"\nrat = 1\n', "rat:"),
        ("[defaults]\nrate = -1\n", "[defaults] rate: Input should be greater than 0"),
        (
            '[[channels]]\nname = "a"\nkind = "slack"\nurl = "https://x"\nsecret = "k"\n',
            "no secret",
        ),
        ("[chanels]\n", "unknown table 'chanels'"),
        ("[[channels]\n", "not valid TOML"),
    ],
)
def test_a_bad_channels_file_names_the_setting(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(NotifyError, match=None) as info:
        config(text, tmp_path, environ={})
    assert error in str(info.value)


def test_pagerduty_and_email_channels_hide_their_keys(tmp_path: Path) -> None:
    notify = config(
        """
        [[channels]]
        name = "on-call"
        kind = "pagerduty"
        routing_key_env = "KEY"

        [[channels]]
        name = "eu"
        kind = "pagerduty"
        routing_key = "${KEY}"
        url = "https://events.eu.pagerduty.com/v2/enqueue"

        [[channels]]
        name = "mail"
        kind = "email"
        smtp_host = "smtp.example.org"
        username_env = "USER"
        password_env = "PASSWORD"
        from = "tv@example.org"
        to = ["a@example.org", "b@example.org"]

        [[channels]]
        name = "relay"
        kind = "email"
        smtp_host = "relay.local"
        starttls = false
        from = "tv@example.org"
        to = ["a@example.org"]
        """,
        tmp_path,
        environ={**ENV, "USER": "bot", "PASSWORD": "pwSECRET"},
    )
    pager, eu, mail, relay = notify.channels
    assert pager.url == "https://events.pagerduty.com/v2/enqueue" and pager.secret == b"keySECRET"
    assert eu.describe()["target"] == "https://events.eu.pagerduty.com" and not eu.groups
    assert mail.smtp is not None and relay.smtp is not None
    assert (mail.smtp.host, mail.smtp.port, mail.smtp.starttls) == ("smtp.example.org", 587, True)
    assert (mail.smtp.username, mail.smtp.password) == ("bot", "pwSECRET")
    assert mail.smtp.recipients == ("a@example.org", "b@example.org") and mail.groups
    assert (relay.smtp.port, relay.smtp.starttls, relay.smtp.username) == (25, False, None)
    assert mail.describe()["target"] == "smtp://smtp.example.org"
    shown = repr(notify) + repr([c.describe() for c in notify.channels])
    assert "SECRET" not in shown and not any(c.describe()["signed"] for c in notify.channels)


def test_errors_never_echo_a_secret_value(tmp_path: Path) -> None:
    text = '[[channels]]\nname = "a"\nkind = "webhook"\nurl = "https://x/SECRET"\nrate = "SECRET"\n'
    with pytest.raises(NotifyError) as info:
        config(text, tmp_path)
    assert "rate" in str(info.value) and "SECRET" not in str(info.value)


def test_names_are_unique_and_unknown_names_list_the_known(tmp_path: Path) -> None:
    one = '[[channels]]\nname = "a"\nkind = "webhook"\nurl = "https://x"\n'
    with pytest.raises(NotifyError, match="'a' is used twice"):
        config(one + one, tmp_path)
    with pytest.raises(NotifyError, match="No channel named 'b'; the channels file has: a"):
        config(one, tmp_path).get("b")


def test_serve_stops_on_a_bad_channels_file_with_the_setting_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "channels.toml"
    path.write_text('[[channels]]\nname = "a"\nkind = "slack"\nurl_env = "TV_TEST_UNSET"\n')
    assert main(["serve", "--port", "0", "--notify", str(path)]) == 2
    assert "TV_TEST_UNSET is not set" in capsys.readouterr().err
