"""Live fan-out across replicas: Redis pub/sub under :class:`~trainvitals.server.live.Hub`.

Several ``trainvitals serve --broker redis://...`` processes behind one load balancer serve
one team: an agent streams to one of them, a browser watches from another. Each live
message a replica would push to its own browsers is published to Redis instead, and every
replica, the publisher included, delivers what it receives to its local browsers. Redis
pub/sub delivers at most once and keeps nothing, which is what a live view wants: a
browser that misses a message reloads from the API, as it does after a disconnect.

Channels (all under ``trainvitals:<db>:``, where ``<db>`` is the URL's database number,
since Redis pub/sub ignores it: two deployments on one Redis server use two numbers):
``runs`` (coalesced run-list changes), ``alerts``, and ``points:<run id>``, to which a
replica subscribes only while one of its browsers watches that run, so points travel only
where they are shown. A run's points that no replica listens to (Redis says so: a publish
reaches nobody) are not even serialised for ``quiet`` seconds, unless a replica says, on
``watching``, that one of its browsers has just asked for them: turning a frame into a
browser message costs as much as judging it.

Ingest never waits on Redis: messages go through a bounded queue to one publisher task
(pipelined), and are dropped, with a warning, while Redis is unreachable. Both the
publisher and the subscriber reconnect with the project's jittered backoff; logs show the
URL with its password masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from trainvitals.backoff import backoff_delays
from trainvitals.exceptions import ConfigurationError
from trainvitals.server.storage import shown_database

log = logging.getLogger("trainvitals.server")

#: The channels, after the prefix: run-list changes, alerts, a run's points, the runs a
#: replica has just begun to watch, runs deleted, and tokens revoked (their websockets close).
RUNS, ALERTS, POINTS, WATCHING, DELETED = "runs", "alerts", "points:", "watching", "deleted"
REVOKED = "revoked"
#: Live messages may have been lost (a replica's connection to Redis broke, or it dropped
#: what it could not publish): each replica closes its browsers' live sockets, whose pages
#: reconnect and reload from the API. Delivered locally by a listener that subscribed again,
#: and published by a publisher that sends again after dropping messages.
INTERRUPTED = "interrupted"
#: Seconds a channel that reached nobody is not published to (unless someone asks for it).
QUIET = 2.0
#: Messages waiting for the publisher; beyond, new ones are dropped (Redis is down or slow).
MAX_PENDING = 50_000
#: Messages sent to Redis in one pipeline.
MAX_BATCH = 1000

#: ``deliver(channel, message)``: a message arrived from the broker (``channel`` without
#: the prefix).
Deliver = Callable[[str, str], None]


def check_broker_url(url: str) -> str:
    """``url`` if it names a Redis server (``redis://``, ``rediss://`` or ``unix://``)."""
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(
            f"--broker expects a redis://host:6379/0 URL (or rediss://, unix://), got "
            f"{shown_database(url)!r}"
        )
    return url


class Broker:
    """Publishes live messages to Redis and hands those that arrive to ``deliver``.

    Example:
        ```python
        broker = Broker("redis://127.0.0.1:6379/0")
        broker.start(lambda channel, message: print(channel, message))
        broker.watch(POINTS + run_id)
        broker.publish(ALERTS, '{"type": "alert", ...}')
        ```
    """

    def __init__(self, url: str, quiet: float = QUIET) -> None:
        self.url = check_broker_url(url)
        self.shown_url = shown_database(url)
        self._secret = urlsplit(url).password
        #: What ``CLIENT LIST`` shows of this replica's connections.
        self.client_name = f"trainvitals-{uuid.uuid4().hex[:12]}"
        self._redis: Redis = Redis.from_url(
            url, health_check_interval=10, client_name=self.client_name
        )
        self.prefix = f"trainvitals:{self._redis.connection_pool.connection_kwargs.get('db', 0)}:"
        self._outgoing: asyncio.Queue[tuple[str, str]] = asyncio.Queue(MAX_PENDING)
        self._channels = {
            self.prefix + channel
            for channel in (RUNS, ALERTS, WATCHING, DELETED, REVOKED, INTERRUPTED)
        }
        self._quiet = quiet
        #: Channel (without the prefix) -> when a publish to it last reached nobody.
        self._unheard: dict[str, float] = {}
        self._pubsub: PubSub | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0

    def start(self, deliver: Deliver) -> None:
        self._tasks = [
            asyncio.create_task(self._publish_forever(), name="trainvitals-broker-out"),
            asyncio.create_task(self._receive_forever(deliver), name="trainvitals-broker-in"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._redis.aclose()

    def publish(self, channel: str, message: str) -> None:
        """Queue ``message`` for every replica's browsers; never blocks."""
        try:
            self._outgoing.put_nowait((self.prefix + channel, message))
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped % 10_000 == 1:
                log.warning(
                    "live broker %s is behind: %d message(s) dropped", self.shown_url, self.dropped
                )

    def heard(self, channel: str) -> bool:
        """Whether a message on ``channel`` may reach anyone (else it need not be made)."""
        since = self._unheard.get(channel)
        return since is None or time.monotonic() - since > self._quiet

    def watch(self, channel: str) -> None:
        """Receive ``channel`` from now on (kept across reconnects)."""
        self._channels.add(self.prefix + channel)
        self._command("subscribe", self.prefix + channel)
        self.publish(WATCHING, channel)  # every replica publishes it again at once

    def unwatch(self, channel: str) -> None:
        self._channels.discard(self.prefix + channel)
        self._command("unsubscribe", self.prefix + channel)

    # -- internals -----------------------------------------------------------------------------

    def _command(self, name: str, channel: str) -> None:
        pubsub = self._pubsub
        if pubsub is None:  # not connected: the next connection subscribes to what is wanted
            return

        async def send() -> None:
            try:
                await getattr(pubsub, name)(channel)
            except (RedisError, OSError):  # the receiver sees it too, and reconnects
                pass

        task = asyncio.create_task(send())
        self._tasks = [t for t in self._tasks if not t.done()] + [task]

    async def _publish_forever(self) -> None:
        delays = backoff_delays()
        dropping = False
        while True:
            batch = [await self._outgoing.get()]
            while len(batch) < MAX_BATCH and not self._outgoing.empty():
                batch.append(self._outgoing.get_nowait())
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for channel, message in batch:
                        pipe.publish(channel, message)
                    receivers = await pipe.execute()
            except (RedisError, OSError) as exc:
                # At most once: what could not be sent is gone; browsers reload from the API.
                self.dropped += len(batch)
                dropping = True
                self._warn("publishing to", exc)
                await asyncio.sleep(next(delays))
            else:
                delays = backoff_delays()
                self._count(batch, receivers)
                if dropping:  # every replica's browsers missed what was dropped
                    dropping = False
                    self.publish(INTERRUPTED, "")

    def _count(self, batch: list[tuple[str, str]], receivers: list[int]) -> None:
        now = time.monotonic()
        if len(self._unheard) > 10_000:  # those older than ``quiet`` count for nothing
            self._unheard = {c: t for c, t in self._unheard.items() if now - t <= self._quiet}
        for (channel, _), count in zip(batch, receivers, strict=True):
            name = channel[len(self.prefix) :]
            if not name.startswith(POINTS):
                continue
            if count:
                self._unheard.pop(name, None)
            else:
                self._unheard[name] = now

    async def _receive_forever(self, deliver: Deliver) -> None:
        delays = backoff_delays()
        cut = False
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            self._pubsub = pubsub  # from here on, watch() subscribes on this connection too
            try:
                await pubsub.subscribe(*set(self._channels))
                delays = backoff_delays()
                if cut:  # what was published meanwhile never came here
                    cut = False
                    deliver(INTERRUPTED, "")
                async for message in pubsub.listen():
                    if message["type"] != "message":
                        continue
                    channel = message["channel"].decode()[len(self.prefix) :]
                    try:
                        if channel == WATCHING:
                            self._unheard.pop(message["data"].decode(), None)
                        else:
                            deliver(channel, message["data"].decode())
                    except Exception:  # a message no replica sent: the next ones still go
                        log.warning("live broker: a malformed message on %r dropped", channel)
            except (RedisError, OSError) as exc:
                cut = True
                self._warn("listening to", exc)
            finally:
                self._pubsub = None
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(next(delays))

    def _warn(self, doing: str, exc: BaseException) -> None:
        reason = str(exc)
        if self._secret:
            reason = reason.replace(self._secret, "***")
        log.warning("live broker: %s %s failed (%s); retrying", doing, self.shown_url, reason)
