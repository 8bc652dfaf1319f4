"""Sending: the token bucket, Retry-After, secrets kept out of httpx's logs, and
``trainvitals notify-test`` against a real HTTP receiver."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from harness.notify import Reply, receiving
from trainvitals.cli import main
from trainvitals.server.notify import Channel
from trainvitals.server.notify.delivery import TokenBucket, redact, retry_after, send_test
from trainvitals.server.notify.messages import probe_message


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0])
    for _ in range(3):
        assert bucket.wait_time() == 0
        bucket.take()
    assert bucket.wait_time() == pytest.approx(0.5)
    now[0] = 0.25
    assert bucket.wait_time() == pytest.approx(0.25)
    now[0] = 100.0  # refills up to the burst, no further
    for _ in range(3):
        bucket.take()
    assert bucket.wait_time() == pytest.approx(0.5)


def test_retry_after_takes_seconds_and_http_dates() -> None:
    assert retry_after("3") == 3.0
    assert retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after("99999") == 600.0
    assert retry_after(None) is None and retry_after("soon") is None


def test_secrets_stay_out_of_httpx_logs(caplog: pytest.LogCaptureFixture) -> None:
    with receiving() as receiver:
        channel = Channel("ops", "webhook", receiver.url("/pathSECRET"), secret=b"keySECRET")
        with caplog.at_level(logging.DEBUG, logger="httpx"):
            outcome = asyncio.run(send_test(channel, probe_message(channel, None)))
    assert outcome.accepted
    assert "HTTP Request: POST <ops url>" in caplog.text and "SECRET" not in caplog.text
    assert redact(f"failed: {channel.url}?x=1 keySECRET", channel) == "failed: <ops url> <ops url>"


@pytest.mark.parametrize(
    "said",
    [
        "POST https://HOOKS.slack.com:443/services/T000/B000/SECRET failed",  # case, port
        "Cannot POST /services/T000/B000/SECRET",  # a receiver echoing the path
        "GET https://hooks.slack.com./services/t000/b000/secret?x=1",  # trailing dot, case
    ],
)
def test_redaction_goes_by_the_parsed_url_not_its_spelling(said: str) -> None:
    channel = Channel("team", "slack", "https://hooks.slack.com/services/T000/B000/SECRET")
    assert "SECRET" not in redact(said, channel).upper()
    assert "<team url>" in redact(said, channel)


def test_another_hosts_url_is_left_alone() -> None:
    channel = Channel("team", "slack", "https://hooks.slack.com/services/T000/B000/SECRET")
    assert redact("see https://status.slack.com/", channel) == "see https://status.slack.com/"


def test_notify_test_says_whether_the_channel_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with receiving() as receiver:
        path = tmp_path / "channels.toml"
        path.write_text(
            f'[[channels]]\nname = "ops"\nkind = "webhook"\nurl = "{receiver.url("/h")}"\n'
        )
        receiver.script("/h", Reply(200), Reply(500, body=b"boom"))
        assert main(["notify-test", "--channel", "ops", "--notify", str(path)]) == 0
        assert "OK: channel 'ops' (webhook, http://127.0.0.1) accepted" in capsys.readouterr().out
        assert receiver.requests[0].json()["type"] == "test"
        assert main(["notify-test", "--channel", "ops", "--notify", str(path)]) == 1
        assert (
            "FAILED: channel 'ops'" in (err := capsys.readouterr().err)
            and "HTTP 500 Internal Server Error" in err
            and "boom" not in err
        )
        assert main(["notify-test", "--channel", "nope", "--notify", str(path)]) == 2
        assert "No channel named 'nope'" in capsys.readouterr().err
    # Nobody listens any more: a network error, said as plainly.
    assert main(["notify-test", "--channel", "ops", "--notify", str(path)]) == 1
    assert "ConnectError" in capsys.readouterr().err
