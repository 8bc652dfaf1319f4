"""The live hub's coalesced run pushes (#17: an edit is not undone by a stale copy)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, cast

from trainvitals.protocol import Clock, ClockedSeries
from trainvitals.server.live import Hub, finite_or_none
from trainvitals.server.storage import RunHealth, RunSummary


def test_a_stale_copy_of_a_run_does_not_undo_its_rename() -> None:
    async def pushed() -> list[dict[str, object]]:
        hub = Hub()
        browser = hub.subscribe()
        renamed = cast(RunSummary, {"id": "r", "project": "p", "name": "new", "tags": ["x"]})
        stale = cast(RunSummary, {"id": "r", "project": "p", "name": "old", "tags": [],
                                  "last_step": 7})  # fmt: skip
        hub.run_changed(renamed, fresh=True)
        hub.run_changed(stale)  # an ingest session's copy, from before the rename
        hub.flush_runs()
        hub.run_changed(stale)
        hub.flush_runs()
        return [json.loads(browser.queue.get_nowait()) for _ in range(2)]

    first, second = asyncio.run(pushed())
    assert first["runs"] == [
        {"id": "r", "project": "p", "name": "new", "tags": ["x"], "last_step": 7}
    ]
    assert second["runs"] == [{"id": "r", "project": "p", "last_step": 7}]


def test_a_runs_health_is_pushed_with_its_summary_or_alone() -> None:
    async def pushed() -> list[dict[str, object]]:
        hub = Hub()
        browser = hub.subscribe()
        critical = RunHealth(worst="critical", rules=["nonfinite"], firing=["nonfinite"])
        hub.run_changed(cast(RunSummary, {"id": "a", "project": "p", "last_step": 3}))
        hub.health_changed("a", "p", critical)
        hub.health_changed("b", "q", RunHealth(worst="warning", rules=["stall"], firing=[]))
        hub.health_changed("gone", "p", critical)
        hub.run_deleted("gone", "p")
        hub.flush_runs()
        hub.flush_runs()  # nothing left to push
        return [json.loads(browser.queue.get_nowait()) for _ in range(browser.queue.qsize())]

    deleted, runs = asyncio.run(pushed())
    assert deleted == {"type": "deleted", "run_id": "gone", "project": "p"}
    assert runs["runs"] == [
        {"id": "a", "project": "p", "last_step": 3, "health": {
            "worst": "critical", "rules": ["nonfinite"], "firing": ["nonfinite"]}},
        {"id": "b", "project": "q", "health": {"worst": "warning", "rules": ["stall"],
                                               "firing": []}},
    ]  # fmt: skip


def test_a_change_after_a_quiet_spell_is_pushed_at_once_and_the_next_waits_its_turn() -> None:
    """The push loop sleeps until something changed (an idle server is not woken for it), pushes
    that first change at once, and at most once an interval after: here an hour, so the second
    change is still held while the loop has run many times over."""

    async def pushed() -> tuple[dict[str, object], int]:
        hub = Hub(runs_push_interval=3600.0)
        browser = hub.subscribe()
        hub.start()
        try:
            hub.run_changed(cast(RunSummary, {"id": "a", "project": "p", "last_step": 1}))
            first = json.loads(await asyncio.wait_for(browser.queue.get(), timeout=30))
            hub.run_changed(cast(RunSummary, {"id": "a", "project": "p", "last_step": 2}))
            for _ in range(100):
                await asyncio.sleep(0)  # the push task's turns: it waits out its hour
            return first, browser.queue.qsize()
        finally:
            await hub.stop()

    first, held = asyncio.run(pushed())
    assert first["runs"] == [{"id": "a", "project": "p", "last_step": 1}]
    assert held == 0


def test_a_runs_firing_alerts_reach_its_own_agents_only() -> None:
    async def told() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        hub = Hub()
        agent, other = hub.agent_listens("r1"), hub.agent_listens("r2")
        firing = {"id": "a1", "run_id": "r1", "project": "p", "state": "firing",
                  "severity": "critical", "rule": "nonfinite", "message": "NaN",
                  "evidence": {"stacks": "long"}}  # fmt: skip
        hub.alert(firing)
        hub.alert({**firing, "id": "a2", "severity": "info"})  # the dashboard's only
        hub.alert({**firing, "id": "a3", "state": "resolved"})
        hub.alert({**firing, "id": "a4", "silenced_until": time.time() + 60})
        hub.agent_left("r1", agent)
        hub.alert({**firing, "id": "a5"})  # gone: nothing more queued for it
        taken = [json.loads(agent.queue.get_nowait()) for _ in range(agent.queue.qsize())]
        return taken, [json.loads(other.queue.get_nowait()) for _ in range(other.queue.qsize())]

    mine, theirs = asyncio.run(told())
    assert theirs == []
    (frame,) = mine
    assert (frame["type"], frame["v"], frame["alert"]["id"]) == ("alert", 1, "a1")
    assert frame["alert"]["severity"] == "critical" and "evidence" not in frame["alert"]


def test_points_go_with_their_clocks_to_a_page_that_asks_and_plain_to_others() -> None:
    """A frame's clock goes once to a browser that connected with ``?clocks=1`` (the
    dashboard), each series with its steps and times to any other; NaN and ±Inf as null."""
    steps, times = [1, 2], [10.0, 10.5]
    points = ClockedSeries(
        [Clock(steps, times), Clock([2], [10.6])],
        {"loss": (0, [0.5, math.nan]), "lr": (0, [0.1, math.inf]), "host/rss": (1, [7.0])},
    )

    async def pushed() -> tuple[dict[str, Any], dict[str, Any]]:
        hub = Hub()
        page, script = hub.subscribe(clocks=True), hub.subscribe()
        for browser in (page, script):
            hub.watch(browser, "r")
        hub.points("r", points)
        return json.loads(page.queue.get_nowait()), json.loads(script.queue.get_nowait())

    clocked, plain = asyncio.run(pushed())
    assert clocked == {
        "type": "points", "run_id": "r", "clocks": {"0": {"step": steps, "time": times}},
        "series": {"loss": {"clock": "0", "value": [0.5, None]},
                   "lr": {"clock": "0", "value": [0.1, None]},
                   "host/rss": {"step": [2], "time": [10.6], "value": [7.0]}},
    }  # fmt: skip
    assert plain == {
        "type": "points", "run_id": "r",
        "series": {"loss": {"step": steps, "time": times, "value": [0.5, None]},
                   "lr": {"step": steps, "time": times, "value": [0.1, None]},
                   "host/rss": {"step": [2], "time": [10.6], "value": [7.0]}},
    }  # fmt: skip


def test_browsers_and_api_clients_read_nan_and_infinities_as_null() -> None:
    assert finite_or_none([0.5, -1e308, 1e308]) == [0.5, -1e308, 1e308]
    assert finite_or_none([1e308, 1e308]) == [1e308, 1e308]  # a sum that overflows
    assert finite_or_none([math.nan, math.inf, -math.inf, 2.0]) == [None, None, None, 2.0]
