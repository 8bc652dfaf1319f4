"""Per-token caps: each refusal is a close code and a reason naming the setting; replicas
sharing a Redis count them together."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from harness.balancer import redis_url
from harness.polling import wait_for_async
from trainvitals.exceptions import IngestRejected
from trainvitals.server.live import Subscriber
from trainvitals.server.quotas import Caps, Quotas, TeamCounts


def test_connections_runs_series_and_bytes_are_capped_per_token() -> None:
    asyncio.run(capped(team=False))


def test_replicas_of_a_team_count_each_tokens_caps_together_in_redis() -> None:
    asyncio.run(capped(team=True))


async def capped(team: bool) -> None:
    """The same caps, for one process or for two replicas sharing a Redis: whatever one
    replica takes, the other can't (each call alternates between the two)."""
    now = [1000.0]
    caps = Caps(connections=2, runs_per_minute=3, series_per_run=4, bytes_per_day=100)
    prefix = f"trainvitals-test:{uuid.uuid4().hex}:"
    url = redis_url()
    teams = [TeamCounts(url, prefix, clock=lambda: now[0]) for _ in range(2 if team else 0)]
    one, two = (
        (Quotas(caps, clock=lambda: now[0], team=t) for t in teams)
        if team
        else ([Quotas(caps, clock=lambda: now[0])] * 2)
    )
    try:
        slot = await one.connect("a")
        await two.connect("a")
        await one.connect("b")  # another token has its own
        with pytest.raises(IngestRejected, match="MAX_CONNECTIONS") as refused:
            await one.connect("a")
        assert refused.value.code == 1013
        one.disconnect("a", slot)
        # The slot comes free (in Redis: a moment later).
        await wait_for_async(lambda: two.connect("a"), timeout=5, what="a free slot")

        for replica in (one, two, one):
            await replica.new_run("a")
        with pytest.raises(IngestRejected, match="MAX_RUNS_PER_MINUTE"):
            await two.new_run("a")
        now[0] += 61
        await two.new_run("a")  # a minute later

        one.received("a", 60)
        for t in teams:
            await t.sync()  # what the background task does every second
        with pytest.raises(IngestRejected, match="MAX_BYTES_PER_DAY"):
            two.received("a", 60)
        now[0] += 86400
        two.received("a", 60)  # a new day
    finally:
        for t in teams:
            await t.stop()


def test_a_run_holds_so_many_series() -> None:
    quotas = Quotas(Caps(series_per_run=4))
    quotas.series(4)
    with pytest.raises(IngestRejected, match="MAX_SERIES_PER_RUN") as refused:
        quotas.series(5)
    assert refused.value.code == 1008


def test_a_killed_replicas_connections_free_themselves_a_lease_later() -> None:
    async def main() -> None:
        now = [1000.0]
        prefix = f"trainvitals-test:{uuid.uuid4().hex}:"
        url = redis_url()
        dead = TeamCounts(url, prefix, clock=lambda: now[0], lease=30.0)
        alive = TeamCounts(url, prefix, clock=lambda: now[0], lease=30.0)
        caps = Caps(connections=1)
        try:
            await Quotas(caps, team=dead).connect("a")  # then killed: never disconnects
            with pytest.raises(IngestRejected, match="MAX_CONNECTIONS"):
                await Quotas(caps, team=alive).connect("a")
            now[0] += 31  # no renewal came from the dead replica
            await Quotas(caps, team=alive).connect("a")
        finally:
            await alive.stop()
            await dead._redis.aclose()

    asyncio.run(main())


def test_without_redis_each_replica_counts_alone_and_says_so_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        team = TeamCounts("redis://:hunter2@127.0.0.1:1/0")
        quotas = Quotas(Caps(connections=1), team=team)
        try:
            await quotas.connect("a")
            with pytest.raises(IngestRejected, match="MAX_CONNECTIONS"):
                await quotas.connect("a")
        finally:
            await team.stop()

    with caplog.at_level(logging.WARNING, "trainvitals.server"):
        asyncio.run(main())
    assert "counting in this replica alone" in caplog.text and "hunter2" not in caplog.text


def test_a_slow_browser_is_dropped_by_bytes_not_only_by_messages() -> None:
    subscriber = Subscriber(queue_size=1000, max_bytes=1000)
    subscriber.offer("x" * 600)
    assert not subscriber.overflowed.is_set()
    subscriber.offer("y" * 600)  # two messages only, but 1,200 bytes
    assert subscriber.overflowed.is_set() and subscriber.queue.qsize() == 1
    message = subscriber.queue.get_nowait()
    subscriber.taken(message)
    assert subscriber.queued_bytes == 0
