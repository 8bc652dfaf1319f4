"""What one token may take of the server, so no single client exhausts it.

Counted per token (without auth, all clients share the one local principal): ingest
connections open at once, new runs a minute, series per run, and bytes of frames per UTC day.
Each refusal is a websocket close with a code and a reason that names the cap and the setting
that raises it; other clients carry on.

One process counts in its memory. Replicas of one team (``serve --broker redis://...``) count
together in Redis (:class:`TeamCounts`), so a token's caps hold across them, not once per
replica: connections and new runs are sorted sets whose members expire (a killed replica's
connections free themselves a lease later), each checked and added in one Lua script, so two
replicas cannot both take the last slot; bytes are summed in the background every second (a
token can overshoot its daily cap by about a second of its traffic). While Redis cannot be
reached, each replica counts on its own again and says so once in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from trainvitals.exceptions import IngestRejected
from trainvitals.protocol import CLOSE_POLICY_VIOLATION, CLOSE_TRY_AGAIN_LATER
from trainvitals.server.storage import shown_database

log = logging.getLogger("trainvitals.server")

#: Seconds a replica's connection counts without being renewed (a killed replica's expire).
CONNECTION_LEASE = 30.0
#: Seconds between the renewals and byte sums of :class:`TeamCounts`.
SYNC_INTERVAL = 1.0

# KEYS[1]: a sorted set of members scored by when they expire. Drops the expired, then adds
# ARGV[3] (expiring at ARGV[2]) unless ARGV[4] members are there already. 1: added.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


@dataclass(frozen=True)
class Caps:
    """The caps, from the server's settings."""

    connections: int = 1000
    runs_per_minute: int = 600
    series_per_run: int = 2000
    bytes_per_day: int = 50 * 2**30


class TeamCounts:
    """A token's connections, new runs and bytes, counted by every replica together in Redis.

    Example:
        ```python
        team = TeamCounts("redis://127.0.0.1:6379/0")
        await team.start()
        if not await team.take_connection("token-id", "conn-1", cap=1000):
            ...  # refused
        ```
    """

    def __init__(
        self,
        url: str,
        prefix: str | None = None,
        clock: Callable[[], float] = time.time,
        lease: float = CONNECTION_LEASE,
    ) -> None:
        self._redis: Redis = Redis.from_url(url)
        self._shown = shown_database(url)
        db = self._redis.connection_pool.connection_kwargs.get("db", 0)
        self.prefix = prefix if prefix is not None else f"trainvitals:{db}:quota:"
        self._clock, self._lease = clock, lease
        self._take = self._redis.register_script(_TAKE)
        #: This replica's open connections: member -> token.
        self._mine: dict[str, str] = {}
        #: Bytes this replica counted and not yet added in Redis: (token, day) -> bytes.
        self._unsent: dict[tuple[str, int], int] = defaultdict(int)
        #: What Redis said each (token, day) totals, every replica included.
        self.totals: dict[tuple[str, int], int] = {}
        self._down = False
        self._task: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._sync_forever(), name="trainvitals-quotas")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(RedisError, OSError):  # free this replica's slots at once
            await self.sync()
            async with self._redis.pipeline(transaction=False) as pipe:
                for member, token in self._mine.items():
                    pipe.zrem(self._key("conn", token), member)
                await pipe.execute()
        await self._redis.aclose()

    async def take_connection(self, token: str, member: str, cap: int) -> bool | None:
        """Count ``member`` as one of ``token``'s connections unless ``cap`` are open on the
        team; None when Redis can't say (the caller counts alone)."""
        now = self._clock()
        taken = await self._call_take(self._key("conn", token), now, now + self._lease, member, cap)
        if taken:
            self._mine[member] = token
        return taken

    def release_connection(self, member: str) -> None:
        token = self._mine.pop(member, None)
        if token is not None:
            task = asyncio.create_task(self._release(token, member))
            self._releasing.add(task)  # a task nobody holds may be collected mid-way
            task.add_done_callback(self._releasing.discard)

    async def take_run(self, token: str, cap: int) -> bool | None:
        """Count a new run of ``token`` unless ``cap`` were made on the team in the last
        minute; None when Redis can't say."""
        now = self._clock()
        key = self._key("runs", token)
        return await self._call_take(key, now, now + 60.0, uuid.uuid4().hex, cap)

    def add_bytes(self, token: str, day: int, size: int) -> int:
        """Count ``size`` bytes; the team's total for the day as far as this replica knows."""
        self._unsent[token, day] += size
        return self.totals.get((token, day), 0) + self._unsent[token, day]

    async def sync(self) -> None:
        """Renew this replica's connections and add its bytes to the team's (every second)."""
        now = self._clock()
        unsent, self._unsent = self._unsent, defaultdict(int)
        # The totals of the tokens connected here too: what the other replicas counted.
        today = int(now // 86400)
        counted = [
            *unsent,
            *((t, today) for t in set(self._mine.values()) - {t for t, _ in unsent}),
        ]
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for member, token in self._mine.items():
                    pipe.zadd(self._key("conn", token), {member: now + self._lease}, xx=True)
                for token, day in counted:
                    key = self._key("bytes", token, str(day))
                    pipe.incrby(key, unsent.get((token, day), 0))
                    pipe.expire(key, 2 * 86400)
                results = await pipe.execute()
        except (RedisError, OSError) as exc:
            for counted_key, size in unsent.items():  # counted again at the next sync
                self._unsent[counted_key] += size
            self._went_down(exc)
            return
        totals = results[len(self._mine) :: 2]
        self.totals = {key: int(total) for key, total in zip(counted, totals, strict=True)}
        self._came_back()

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(SYNC_INTERVAL)
            await self.sync()

    async def _call_take(
        self, key: str, now: float, expires: float, member: str, cap: int
    ) -> bool | None:
        try:
            taken = await self._take(keys=[key], args=[now, expires, member, cap, 2 * 60 * 60])
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            return None
        self._came_back()
        return bool(taken)

    async def _release(self, token: str, member: str) -> None:
        try:
            await self._redis.zrem(self._key("conn", token), member)
        except (RedisError, OSError) as exc:  # it expires a lease later anyway
            self._went_down(exc)

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _went_down(self, exc: BaseException) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "quotas: Redis at %s unreachable (%s); counting in this replica alone",
                self._shown,
                type(exc).__name__,
            )

    def _came_back(self) -> None:
        if self._down:
            self._down = False
            log.warning("quotas: Redis at %s reachable again; counting as a team", self._shown)


class Quotas:
    """The counters behind :class:`Caps`, one set per token id: in this process, or with
    ``team`` across every replica of the team."""

    def __init__(
        self, caps: Caps, clock: Callable[[], float] = time.time, team: TeamCounts | None = None
    ) -> None:
        self.caps = caps
        self._clock = clock
        self._team = team
        self._connections: dict[str, int] = defaultdict(int)
        self._new_runs: dict[str, deque[float]] = defaultdict(deque)
        self._bytes: dict[str, tuple[int, int]] = {}  # token -> (UTC day, bytes that day)

    async def connect(self, token: str) -> str:
        """An ingest connection opens; refused past the cap (1013: try again later).
        Returns the connection's name, for :meth:`disconnect`."""
        member = uuid.uuid4().hex
        taken = None
        if self._team is not None:
            taken = await self._team.take_connection(token, member, self.caps.connections)
        if taken is None:
            taken = self._connections[token] < self.caps.connections
        if not taken:
            raise IngestRejected(
                CLOSE_TRY_AGAIN_LATER,
                f"this token has {self.caps.connections} connections open already "
                "(TRAINVITALS_MAX_CONNECTIONS)",
            )
        self._connections[token] += 1
        return member

    def disconnect(self, token: str, member: str = "") -> None:
        self._connections[token] = max(0, self._connections[token] - 1)
        if self._team is not None:
            self._team.release_connection(member)

    async def new_run(self, token: str) -> None:
        """A run is about to be created; refused past the cap of the last 60 seconds."""
        now = self._clock()
        made = self._new_runs[token]
        while made and made[0] <= now - 60.0:
            made.popleft()
        taken = None
        if self._team is not None:
            taken = await self._team.take_run(token, self.caps.runs_per_minute)
        if taken is None:
            taken = len(made) < self.caps.runs_per_minute
        if not taken:
            raise IngestRejected(
                CLOSE_TRY_AGAIN_LATER,
                f"this token made {self.caps.runs_per_minute} runs in the last minute "
                "(TRAINVITALS_MAX_RUNS_PER_MINUTE)",
            )
        made.append(now)

    def series(self, count: int) -> None:
        """A run would hold ``count`` series."""
        if count > self.caps.series_per_run:
            raise IngestRejected(
                CLOSE_POLICY_VIOLATION,
                f"a run may hold {self.caps.series_per_run} series, this one would hold "
                f"{count} (TRAINVITALS_MAX_SERIES_PER_RUN)",
            )

    def received(self, token: str, size: int) -> None:
        """``size`` bytes of frames arrived; refused past the day's cap."""
        day = int(self._clock() // 86400)
        seen_day, total = self._bytes.get(token, (day, 0))
        total = (total if seen_day == day else 0) + size
        self._bytes[token] = (day, total)
        if self._team is not None:
            total = max(total, self._team.add_bytes(token, day, size))
        if total > self.caps.bytes_per_day:
            raise IngestRejected(
                CLOSE_TRY_AGAIN_LATER,
                f"this token sent over {self.caps.bytes_per_day} bytes today "
                "(TRAINVITALS_MAX_BYTES_PER_DAY)",
            )
