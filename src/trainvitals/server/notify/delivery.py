"""Sending to one channel: an HTTP (or SMTP) attempt, its outcome, retries, pace and grouping.

Each channel has one :class:`ChannelSender` task, which sends one message at a time in the
order notices came, so a resolution never overtakes its alert. A message is retried on
network errors, 5xx and 429 (after Slack's ``Retry-After``) with a jittered exponential
backoff, the same message with the same delivery key each time; any other answer gives it
up. Between messages the channel keeps its pace: notices that arrive within
``group_window`` seconds of its last message wait for the window to end, and the token
bucket (``rate``, ``burst``) holds back the next message; whatever piled up meanwhile goes
out as one grouped message, or, past ``group_max``, as one digest of up to ``flood_max``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import smtplib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from trainvitals.backoff import backoff_delays
from trainvitals.server.notify import mail
from trainvitals.server.notify.config import Channel
from trainvitals.server.notify.messages import Message, Notice, headers, render
from trainvitals.server.writer import log_failure

log = logging.getLogger("trainvitals.server")

#: The longest ``Retry-After`` honoured as given; longer ones wait this long.
MAX_RETRY_AFTER = 600.0


@dataclass(frozen=True)
class Outcome:
    """How one attempt went. ``detail`` never holds the channel's URL."""

    accepted: bool
    retry: bool
    detail: str
    status: int | None = None
    retry_after: float | None = None


async def post(client: httpx.AsyncClient, channel: Channel, message: Message) -> Outcome:
    """One attempt to deliver ``message`` to ``channel``."""
    if channel.smtp is not None:
        return await asyncio.to_thread(_send_mail, channel, message)
    try:
        response = await client.post(
            channel.url,
            content=message.body,
            headers=headers(channel, message),
            timeout=channel.timeout,
        )
    except httpx.HTTPError as exc:  # connection refused, timeout, reset, ...
        return Outcome(False, True, redact(f"{type(exc).__name__}: {exc}", channel))
    status = response.status_code
    if 200 <= status < 300:
        return Outcome(True, False, f"HTTP {status}", status)
    # The status, never the body: receivers echo the request's path, and a Slack URL's path
    # is its secret.
    detail = f"HTTP {status}" + (f" {response.reason_phrase}" if response.reason_phrase else "")
    if status == 429 or status >= 500:
        wait = retry_after(response.headers.get("Retry-After"))
        return Outcome(False, True, detail, status, wait)
    return Outcome(False, False, detail, status)


def _send_mail(channel: Channel, message: Message) -> Outcome:
    """One SMTP exchange. As with HTTP, a transient answer (4xx, a dropped connection, a
    timeout) is retried and a permanent one (5xx: a refused login or recipient) is not."""
    assert channel.smtp is not None
    try:
        mail.send(channel.smtp, message, channel.timeout)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = sorted(code for code, _ in exc.recipients.values())
        detail = f"SMTP {codes[0] if codes else ''}: recipients refused"
        return Outcome(
            False, any(400 <= c < 500 for c in codes), detail, codes[0] if codes else None
        )
    except smtplib.SMTPNotSupportedError as exc:
        return Outcome(False, False, redact(f"SMTPNotSupportedError: {exc}", channel))
    except smtplib.SMTPResponseException as exc:
        error = (
            exc.smtp_error.decode(errors="replace")
            if isinstance(exc.smtp_error, bytes)
            else str(exc.smtp_error)
        )
        detail = redact(f"SMTP {exc.smtp_code} {error}", channel)
        return Outcome(False, 400 <= exc.smtp_code < 500, detail, exc.smtp_code)
    except (smtplib.SMTPException, OSError) as exc:  # connection refused, timeout, dropped
        return Outcome(False, True, redact(f"{type(exc).__name__}: {exc}", channel))
    return Outcome(True, False, "SMTP 250")


async def send_test(channel: Channel, message: Message) -> Outcome:
    """One attempt with a client of its own (``trainvitals notify-test``)."""
    with RedactSecrets([channel]):
        async with httpx.AsyncClient() as client:
            return await post(client, channel, message)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: seconds, or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def redact(text: str, channel: Channel) -> str:
    """``text`` with the channel's URL and secrets taken out.

    Error messages quote the request URL, and for Slack the URL is the secret, so the match is
    made on the parsed URL, not its spelling: any URL to the channel's host and port (host
    case and the default port ignored) becomes ``<name url>``, and so does any mention of the
    URL's path, query or user info on its own (``Cannot POST /services/T000/B000/XXXX``).
    """
    label = f"<{channel.name} url>"
    host, port = _host_port(channel.url)
    if host:

        def same_host(match: re.Match[str]) -> str:
            return label if _host_port(match.group(0)) == (host, port) else match.group(0)

        text = _URL.sub(same_host, text)
    parts = urlsplit(channel.url)
    secrets = [parts.query, parts.username or "", parts.password or ""]
    if len(parts.path.strip("/")) >= 4:  # a path that can carry a secret, not "/" or "/in"
        secrets.append(parts.path.rstrip("/"))
    if channel.secret:
        secrets.append(channel.secret.decode(errors="replace"))
    if channel.smtp is not None and channel.smtp.password:
        secrets.append(channel.smtp.password)
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = re.sub(re.escape(secret), label, text, flags=re.IGNORECASE)
    return text


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_port(url: str) -> tuple[str, int | None]:
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return "", None
    return (parts.hostname or "").lower().rstrip("."), port


class RedactSecrets(logging.Filter):
    """Takes channel URLs and secrets out of the HTTP client's own log records: httpx logs
    every request's URL at INFO, and a Slack webhook's URL is its secret.

    Example:
        ```python
        with RedactSecrets(config.channels):
            ...  # requests to the channels
        ```
    """

    LOGGER = "httpx"

    def __init__(self, channels: Sequence[Channel]) -> None:
        super().__init__()
        self._channels = tuple(channels)

    def filter(self, record: logging.LogRecord) -> bool:
        message = clean = record.getMessage()
        for channel in self._channels:
            clean = redact(clean, channel)
        if clean != message:
            record.msg, record.args = clean, ()
        return True

    def __enter__(self) -> RedactSecrets:
        logging.getLogger(self.LOGGER).addFilter(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger(self.LOGGER).removeFilter(self)


class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst``; one message costs one token."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._last = clock()

    def wait_time(self) -> float:
        """Seconds until a token is there (0 when one is)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    def take(self) -> None:
        self._refill()
        self._tokens -= 1

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now


class Journal(Protocol):
    """Where a sender records what happened to its notices (the outbox)."""

    def attempted(self, ids: list[str], error: str) -> Awaitable[None]: ...

    def done(
        self, ids: list[str], state: str, when: float, error: str | None = None
    ) -> Awaitable[None]: ...


class ChannelSender:
    """The task that sends one channel's notices."""

    def __init__(
        self,
        channel: Channel,
        client: httpx.AsyncClient,
        journal: Journal,
        public_url: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channel = channel
        self._client, self._journal, self._public_url = client, journal, public_url
        self._clock = clock
        self._bucket = TokenBucket(channel.rate, channel.burst, clock)
        self._pending: list[Notice] = []
        self._known: set[str] = set()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._last_sent = -math.inf
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._run(), name=f"trainvitals-notify-{self.channel.name}"
        )

    def add(self, notices: Sequence[Notice]) -> None:
        """Queue notices (one already queued is ignored)."""
        for notice in notices:
            if notice.id not in self._known:
                self._known.add(notice.id)
                self._pending.append(notice)
        self._wake.set()

    async def stop(self, timeout: float) -> None:
        """Finish the attempt in flight (up to ``timeout`` seconds), then end; what is left
        stays pending in the outbox for the next start."""
        self._stopping.set()
        self._wake.set()
        if self._task is None:
            return
        done, _ = await asyncio.wait([self._task], timeout=timeout)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            window = self.channel.group_window if self.channel.groups else 0.0
            hold = max(self._last_sent + window - self._clock(), self._bucket.wait_time())
            if hold > 0:  # what arrives meanwhile joins this message
                await self._pause(hold)
                continue
            batch = self._pending[: self._batch_size()]
            try:
                await self._deliver(batch)
            except Exception as exc:  # the database or a bug: keep the channel alive
                log_failure(exc, "notification channel %s: delivery failed", self.channel.name)
                await self._pause(1.0)

    def _batch_size(self) -> int:
        """A group, or when a storm left more than a group waiting, a digest of up to
        ``flood_max``: a flood of runs pages a channel a few times, not once per run."""
        channel = self.channel
        if not channel.groups:
            return 1
        if len(self._pending) <= channel.group_max:
            return channel.group_max
        return max(channel.group_max, channel.flood_max)

    async def _deliver(self, batch: list[Notice]) -> None:
        channel = self.channel
        message = render(channel, batch, self._public_url)
        ids = [n.id for n in batch]
        delays = backoff_delays(initial=0.5, maximum=60.0)
        while True:
            self._bucket.take()
            outcome = await post(self._client, channel, message)
            now = time.time()
            if outcome.accepted:
                self._last_sent = self._clock()
                await self._settle(batch, self._journal.done(ids, "delivered", now))
                return
            if not outcome.retry or now - batch[0].created_at > channel.give_up_after:
                log.warning(
                    "notification channel %s: gave up on %d alert change(s): %s",
                    channel.name,
                    len(batch),
                    outcome.detail,
                )
                await self._settle(batch, self._journal.done(ids, "failed", now, outcome.detail))
                return
            await self._journal.attempted(ids, outcome.detail)
            wait = outcome.retry_after if outcome.retry_after is not None else next(delays)
            log.warning(
                "notification channel %s: %s; retrying in %.1f s",
                channel.name,
                outcome.detail,
                wait,
            )
            await self._pause(wait)
            if self._stopping.is_set():
                return

    async def _settle(self, batch: list[Notice], record: Awaitable[None]) -> None:
        """Drop the batch from the queue; then record it (a notice that could not be marked
        would be sent again after a restart, with the same delivery key)."""
        self._pending = self._pending[len(batch) :]
        try:
            await record
        finally:
            self._known.difference_update(n.id for n in batch)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
