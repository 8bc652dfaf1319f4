"""Live fan-out through a real Redis: what one hub publishes, every hub's browsers get, each
filtered as without a broker; a broker that can't be reached is retried, its password never
shown."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
from redis.asyncio import Redis

from harness.balancer import redis_url
from harness.polling import wait_for_async
from trainvitals.exceptions import ConfigurationError
from trainvitals.protocol import Clock, ClockedSeries, Columns
from trainvitals.server.broker import POINTS, QUIET, Broker, check_broker_url
from trainvitals.server.live import Hub, Subscriber
from trainvitals.server.storage import RunSummary


def gathered(subscriber: Subscriber, into: list[dict[str, Any]]) -> int:
    """Add what ``subscriber`` got since to ``into``; how many ``into`` holds now."""
    into.extend(messages(subscriber))
    return len(into)


def messages(subscriber: Subscriber, probes: bool = False) -> list[dict[str, Any]]:
    """What ``subscriber`` got, but the probes (unless asked for)."""
    taken = []
    while not subscriber.queue.empty():
        message = json.loads(subscriber.queue.get_nowait())
        if probes or message.get("alert", {}).get("id") != "probe":
            taken.append(message)
    return taken


def alert_arrives(sender: Hub, browser: Subscriber, alert_id: str) -> bool:
    """Publish an alert from ``sender``; whether ``browser`` (of another hub) has it yet."""
    sender.alert({"id": alert_id, "project": "p"})
    return any(m["alert"]["id"] == alert_id for m in messages(browser, probes=True))


def run(run_id: str, project: str) -> RunSummary:
    summary = {"id": run_id, "project": project, "name": run_id, "status": "running"}
    return summary  # type: ignore[return-value]


def on_two_replicas(scenario: Callable[[Hub, Hub], Awaitable[None]], quiet: float = QUIET) -> None:
    async def main() -> None:
        url = redis_url()
        one, two = Hub(broker=Broker(url, quiet)), Hub(broker=Broker(url, quiet))
        one.start()
        two.start()
        try:
            await scenario(one, two)
        finally:
            await one.stop()
            await two.stop()

    asyncio.run(main())


def test_points_alerts_and_runs_reach_the_browsers_of_every_replica_as_filtered() -> None:
    async def scenario(one: Hub, two: Hub) -> None:
        everyone, mnist_only = one.subscribe(), one.subscribe(project="mnist")
        page = one.subscribe(clocks=True)  # the dashboard: points with their clocks
        one.watch(everyone, "r1")
        one.watch(page, "r1")
        here = two.subscribe()

        # Both replicas listen once a probe reaches both (subscribing takes a moment).
        def probed() -> bool:
            two.alert({"id": "probe", "project": "probe"})
            return not everyone.queue.empty() and not here.queue.empty()

        await wait_for_async(probed)

        clock = Clock([1, 2, 3], [10.0, 11.0, 12.0])
        on_it = {"loss": (0, [0.5, math.nan, -math.inf]), "lr": (0, [0.1, 0.1, 0.1])}
        two.points("r1", ClockedSeries([clock], on_it))
        two.points("r2", {"loss": Columns([1], [10.0], [0.5])})  # nobody watches r2
        two.alert({"id": "a1", "project": "gan"})
        two.run_changed(run("r1", "mnist"))
        two.run_changed(run("r2", "gan"))
        two.flush_runs()
        got: list[dict[str, Any]] = []
        await wait_for_async(lambda: gathered(everyone, got) >= 3)
        await wait_for_async(lambda: not mnist_only.queue.empty())
        assert [m["type"] for m in got] == ["points", "alert", "runs"]
        assert got[0]["run_id"] == "r1"
        assert got[0]["series"] == {
            "loss": {"step": [1, 2, 3], "time": [10.0, 11.0, 12.0], "value": [0.5, None, None]},
            "lr": {"step": [1, 2, 3], "time": [10.0, 11.0, 12.0], "value": [0.1, 0.1, 0.1]},
        }
        # Offered with everyone's: as published, its clock once.
        clocked = next(m for m in messages(page) if m["type"] == "points")
        assert clocked["clocks"] == {"0": {"step": [1, 2, 3], "time": [10.0, 11.0, 12.0]}}
        assert clocked["series"]["loss"] == {"clock": "0", "value": [0.5, None, None]}
        assert [r["id"] for r in got[2]["runs"]] == ["r1", "r2"]
        # The mnist browser sees no gan alert and only mnist's runs; the publisher's own
        # browser gets what it published, through the broker like the others.
        only = messages(mnist_only)
        assert [m["type"] for m in only] == ["runs"]
        assert [r["id"] for r in only[0]["runs"]] == ["r1"]
        theirs: list[dict[str, Any]] = []
        await wait_for_async(lambda: gathered(here, theirs) >= 2)
        assert [m["type"] for m in theirs] == ["alert", "runs"]

        # A run's agent connected to `one` hears the alert found on `two` (its detector's).
        agent = one.agent_listens("r1")
        two.alert({"id": "a2", "run_id": "r1", "project": "mnist", "state": "firing",
                   "severity": "warning", "rule": "stall", "message": "m"})  # fmt: skip
        await wait_for_async(lambda: not agent.queue.empty())
        assert json.loads(agent.queue.get_nowait())["alert"]["id"] == "a2"

        one.unsubscribe(everyone)
        one.unsubscribe(page)  # nobody on `one` watches r1 now: its points stop coming
        assert one._watched == {}

    on_two_replicas(scenario)


def test_a_deleted_run_leaves_the_browsers_of_every_replica_that_see_its_project() -> None:
    async def scenario(one: Hub, two: Hub) -> None:
        everyone, mnist_only, gan_only = (
            one.subscribe(),
            one.subscribe("mnist"),
            two.subscribe("gan"),
        )

        def probed() -> bool:
            two.alert({"id": "probe", "project": "probe"})
            return not everyone.queue.empty()

        await wait_for_async(probed)
        two.run_deleted("r1", "gan")
        got: list[dict[str, Any]] = []
        await wait_for_async(lambda: gathered(everyone, got) >= 1)
        assert got == [{"type": "deleted", "run_id": "r1", "project": "gan"}]
        theirs: list[dict[str, Any]] = []
        await wait_for_async(lambda: gathered(gan_only, theirs) >= 1)
        assert theirs[0]["type"] == "deleted"
        assert messages(mnist_only) == []  # another project's browser hears nothing of it

    on_two_replicas(scenario)


def test_a_revoked_token_reaches_every_replica_once() -> None:
    """Each replica closes the websockets of a token revoked on any of them."""
    heard: dict[str, list[str]] = {"one": [], "two": []}

    async def main() -> None:
        url = redis_url()
        one = Hub(broker=Broker(url), on_revoked=heard["one"].append)
        two = Hub(broker=Broker(url), on_revoked=heard["two"].append)
        one.start()
        two.start()
        try:
            probe = one.subscribe()

            def probed() -> bool:
                two.alert({"id": "probe", "project": "probe"})
                return not probe.queue.empty()

            await wait_for_async(probed)  # both listen
            two.token_revoked("0123456789ab")
            await wait_for_async(lambda: bool(heard["one"]) and len(heard["two"]) == 2)
        finally:
            await one.stop()
            await two.stop()

    asyncio.run(main())
    assert heard["one"] == ["0123456789ab"]
    # The replica it was revoked on closes its own at once, and hears it back from Redis.
    assert heard["two"] == ["0123456789ab", "0123456789ab"]


def test_a_token_revoked_while_redis_is_unreachable_still_closes_this_replicas() -> None:
    heard: list[str] = []

    async def main() -> None:
        hub = Hub(broker=Broker("redis://127.0.0.1:1/0"), on_revoked=heard.append)
        hub.start()
        try:
            hub.token_revoked("0123456789ab")
        finally:
            await hub.stop()

    asyncio.run(main())
    assert heard == ["0123456789ab"]


def test_an_unreachable_broker_is_retried_and_its_password_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        hub = Hub(broker=Broker("redis://:hunter2@127.0.0.1:1/0"))
        hub.start()
        subscriber = hub.subscribe()
        hub.alert({"id": "a", "project": "p"})  # dropped: at most once
        await wait_for_async(lambda: sum("live broker" in r.message for r in caplog.records) >= 3)
        await hub.stop()
        assert subscriber.queue.empty()

    with caplog.at_level(logging.WARNING, logger="trainvitals.server"):
        asyncio.run(main())
    text = caplog.text
    assert "redis://:***@127.0.0.1:1/0" in text and "hunter2" not in text


def test_the_broker_url_must_name_redis() -> None:
    assert check_broker_url("redis://h:6379/0") == "redis://h:6379/0"
    with pytest.raises(ConfigurationError, match=r"redis://host:6379/0.*nats://u:\*\*\*@h"):
        check_broker_url("nats://u:secret@h:4222")


def test_points_nobody_watches_are_not_made_until_a_replica_asks_for_them() -> None:
    loss = {"loss": Columns([1], [10.0], [0.5])}

    async def scenario(one: Hub, two: Hub) -> None:
        broker = two._broker
        assert broker is not None
        browser = one.subscribe()
        two.points("r9", loss)  # Redis answers that nobody listens
        await wait_for_async(lambda: not broker.heard(POINTS + "r9"))
        two.points("r9", loss)  # not even made into a message now
        one.watch(browser, "r9")  # ... until a browser anywhere asks for the run
        await wait_for_async(lambda: broker.heard(POINTS + "r9"))

        def arrived() -> bool:
            two.points("r9", loss)  # until the new subscription holds
            return any(m["type"] == "points" for m in messages(browser))

        await wait_for_async(arrived)

    on_two_replicas(scenario, quiet=3600.0)  # only the ask can bring them back


def test_a_malformed_message_on_the_broker_is_dropped_and_the_next_ones_still_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(one: Hub, two: Hub) -> None:
        assert one._broker is not None
        browser = one.subscribe()
        prefix = one._broker.prefix
        stranger = Redis.from_url(one._broker.url)

        try:
            await wait_for_async(partial(alert_arrives, two, browser, "before"))  # listening
            for channel in ("alerts", "runs", "watching"):
                await stranger.publish(prefix + channel, b"\xff not json")
            await wait_for_async(partial(alert_arrives, two, browser, "after"))
        finally:
            await stranger.aclose()

    with caplog.at_level(logging.WARNING, logger="trainvitals.server"):
        on_two_replicas(scenario)
    assert "a malformed message on 'alerts' dropped" in caplog.text


def test_a_replica_cut_off_from_the_broker_reconnects_and_hears_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario(one: Hub, two: Hub) -> None:
        assert one._broker is not None
        browser = one.subscribe()
        admin = Redis.from_url(one._broker.url)

        try:
            await wait_for_async(partial(alert_arrives, two, browser, "before"))
            clients = await admin.client_list()
            ours = [c["id"] for c in clients if c["name"] == one._broker.client_name]
            assert ours
            assert not browser.overflowed.is_set()
            for client in ours:  # as when Redis restarts, or a network cut
                await admin.client_kill_filter(_id=client)
            await wait_for_async(partial(alert_arrives, two, browser, "after"))
            # What was published meanwhile never came: the browser reconnects and reloads.
            assert browser.interrupted and browser.overflowed.is_set()
        finally:
            await admin.aclose()

    with caplog.at_level(logging.WARNING, logger="trainvitals.server"):
        on_two_replicas(scenario)
    assert "live broker: listening to" in caplog.text
