"""The notifier: alert changes routed to channels through a persistent outbox.

The alert engine hands every alert change to :meth:`Notifier.enqueue` inside the very
transaction that stores the alert, so an alert that is stored has its notices stored too,
and one that is not has none. Once committed they go to the channels' senders. A notice is
marked delivered as soon as its receiver accepts it; on start, and every third of
``lease`` seconds after, the notifier renews the leases of the notices it holds and takes
over pending ones whose lease ran out: those of a server that was killed (or, sharing
PostgreSQL, of one that died). A server that stops cleanly releases its notices, so the next
one takes them at once.

Nothing accepted is sent twice, except in the moment between a receiver's answer and the
commit that records it: a server killed then sends that message again after its restart,
with the same ``X-Trainvitals-Delivery`` key, for receivers to drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from functools import partial

import httpx

from trainvitals.detect import Alert, Change
from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.server.notify.config import NotifyConfig
from trainvitals.server.notify.delivery import ChannelSender, RedactSecrets
from trainvitals.server.notify.messages import Notice, NoticeChange
from trainvitals.server.notify.store import OutboxStore
from trainvitals.server.storage.unit_of_work import UnitOfWork
from trainvitals.server.writer import Writer, log_failure

log = logging.getLogger("trainvitals.server")

#: Seconds a server holds its pending notices without renewing them before another takes
#: them over (and so how long a killed server's notices wait for the next one).
DEFAULT_LEASE = 15.0


class Notifier:
    """Routes alert changes into the outbox and runs one sender per channel."""

    def __init__(
        self,
        config: NotifyConfig,
        outbox: OutboxStore,
        writer: Writer,
        public_url: str | None = None,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        self.config = config
        self._outbox, self._writer = outbox, writer
        self._public_url, self._lease = public_url, lease
        self.owner = uuid.uuid4().hex
        self._client: httpx.AsyncClient | None = None
        self._senders: dict[str, ChannelSender] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._redact = RedactSecrets(config.channels)

    # -- in the alert's transaction (writer thread) --------------------------------------------

    def enqueue(self, work: UnitOfWork, changes: Sequence[tuple[Change, Alert]]) -> list[Notice]:
        """Store a notice for each channel that wants each change; returns them.

        A firing alert goes to the channels routed for its project and severity unless it
        is silenced; its resolution goes to the channels that were told it fired. An alert
        closed because its run ended is sent nowhere: the end is the ``crash`` alert's news
        (or good news), and the problem was not seen to go away. Updates
        (moving evidence) are not sent, except to a channel the alert now reaches that was
        never told of it (a warning escalated to critical, for a critical-only channel): for
        that channel it fires now."""
        now = time.time()
        notices = []
        told: dict[tuple[str, str], str | None] = {}  # this transaction's, before the stored

        def last_told(key: tuple[str, str]) -> str | None:
            if key not in told:
                told[key] = self._outbox.last_notice_change(work, *key)
            return told[key]

        for change, alert in changes:
            if change == "closed" or (alert.silenced_until or 0) > now:
                continue
            for channel in self.config.channels:
                key = (alert.id, channel.name)
                sent: NoticeChange
                if change == "resolved":
                    wanted, sent = last_told(key) == "fired", "resolved"
                elif change == "fired":
                    wanted, sent = channel.wants(alert), "fired"
                else:  # updated
                    wanted, sent = channel.wants(alert) and last_told(key) is None, "fired"
                if wanted:
                    told[key] = sent
                    notices.append(Notice(uuid.uuid4().hex, channel.name, sent, alert, now))
        self._outbox.add_notices(work, notices, self.owner, now + self._lease)
        return notices

    # -- on the event loop ---------------------------------------------------------------------

    def deliver(self, notices: Sequence[Notice]) -> None:
        """Hand committed notices to their channels' senders."""
        for notice in notices:
            self._senders[notice.channel].add([notice])

    async def start(self) -> None:
        self._redact.__enter__()
        self._client = httpx.AsyncClient()
        for channel in self.config.channels:
            sender = ChannelSender(channel, self._client, self, self._public_url)
            sender.start()
            self._senders[channel.name] = sender
        await self._sweep()  # what a previous server left undelivered
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="trainvitals-outbox")

    async def stop(self, timeout: float = 5.0) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await asyncio.gather(*(s.stop(timeout) for s in self._senders.values()))
        with contextlib.suppress(WriterClosed, StorageUnavailable):
            await self._writer.submit(partial(self._outbox.release_notices, owner=self.owner))
        if self._client is not None:
            await self._client.aclose()
        self._redact.__exit__()

    # -- the senders' journal ------------------------------------------------------------------

    async def attempted(self, ids: list[str], error: str) -> None:
        await self._writer.submit(partial(self._outbox.notice_attempted, ids=ids, error=error))

    async def done(self, ids: list[str], state: str, when: float, error: str | None = None) -> None:
        await self._writer.submit(
            partial(self._outbox.notices_done, ids=ids, state=state, when=when, error=error)
        )

    # -- internals -----------------------------------------------------------------------------

    async def _sweep(self) -> None:
        now = time.time()
        rows = await self._writer.submit(
            partial(
                self._outbox.claim_notices,
                owner=self.owner,
                channels=list(self._senders),
                now=now,
                lease_until=now + self._lease,
            )
        )
        if rows:
            log.warning("taking up %d undelivered notification(s)", len(rows))
        for row in rows:
            alert = Alert.from_dict(row["alert"])
            notice = Notice(row["id"], row["channel"], row["change"], alert, row["created_at"])
            self._senders[row["channel"]].add([notice])

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(max(self._lease / 3, 0.1))
            try:
                await self._sweep()
            except WriterClosed:
                return
            except Exception as exc:  # a database hiccup must not end the sweeps
                log_failure(exc, "outbox sweep failed")
