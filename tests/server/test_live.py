"""The live hub's coalesced run pushes (#17: an edit is not undone by a stale copy)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

from trainvitals.server.live import Hub
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
