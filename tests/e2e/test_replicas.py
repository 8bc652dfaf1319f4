"""Replicas of one team server (#19): real PostgreSQL, real Redis, real nginx, two
``trainvitals serve`` processes. A browser on either sees every run; a run's detector moves
with its agent without losing or doubling an alert; a replica killed mid-run costs no point."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from harness.balancer import Team, redis_url, team
from harness.metrics import parse, scrape, value
from harness.polling import wait_for
from harness.processes import ServerProcess, postgres_database, run_series
from trainvitals import Run, resolve


@pytest.fixture(scope="module")
def replicas() -> Iterator[Team]:
    # Short leases and a short silence: a replica notices within half a second that a run
    # moved away, or that it went silent.
    env = {"TRAINVITALS_LEASE": "1.5", "TRAINVITALS_LOST_AFTER": "2"}
    with postgres_database() as db, team(db, redis_url(), env=env) as running:
        yield running


def ws(server: ServerProcess, path: str) -> ClientConnection:
    url = server.url.replace("http", "ws", 1) + path
    return connect(url, additional_headers={"Authorization": f"Bearer {server.token}"})


def test_a_browser_on_one_replica_sees_the_points_and_alerts_of_a_run_on_the_other(
    replicas: Team, tmp_path: Path
) -> None:
    one, two = replicas.replicas
    config = resolve(server=two.url, project="p", token=two.token, spool_dir=tmp_path)
    run = Run(config, system_metrics=False, watchdog=False)
    run.start()
    seen: dict[str, list[Any]] = {"points": [], "alert": []}
    with ws(one, "/api/v1/live") as browser:
        browser.send(json.dumps({"type": "subscribe", "run_id": run.id}))

        def arrived(kind: str) -> bool:
            run.log(len(seen["points"]) + 1, {"loss": 0.5})  # until the subscription holds
            try:
                message = json.loads(browser.recv(timeout=0.2))
            except TimeoutError:
                return False
            if message.get("run_id", message.get("alert", {}).get("run_id")) == run.id:
                seen[message["type"]].append(message)
            return bool(seen[kind])

        wait_for(lambda: arrived("points"), timeout=20, what="points through the broker")
        run.log(10_000, {"loss": float("nan"), "nonfinite/loss": 1.0})
        wait_for(lambda: arrived("alert"), timeout=20, what="the alert through the broker")
    assert run.finish()
    assert seen["points"][0]["series"]["loss"]["value"][0] == 0.5
    alert = seen["alert"][0]["alert"]
    assert (alert["rule"], alert["state"]) == ("nonfinite", "firing")


class Agent:
    """A raw agent connection to one replica: hello, numbered points, acks."""

    def __init__(self, server: ServerProcess, run_id: str, secret: str) -> None:
        self.socket = ws(server, "/api/v1/ingest")
        self.socket.send(json.dumps({"type": "hello", "v": 1, "run_id": run_id, "project": "p",
                                     "name": run_id, "started_at": 1.0,
                                     "run_secret": secret}))  # fmt: skip
        self.seq = json.loads(self.socket.recv(timeout=20))["last_seq"]

    def send(self, steps: range, loss: float) -> None:
        self.seq += 1
        columns = {"step": list(steps), "time": [1.0 + s for s in steps]}
        series = {"loss": {**columns, "value": [loss] * len(steps)}}
        if loss != loss:  # NaN: the agent counts it too
            series["nonfinite/loss"] = {**columns, "value": [1.0] * len(steps)}
        self.socket.send(json.dumps({"type": "points", "v": 1, "seq": self.seq,
                                     "series": series}))  # fmt: skip
        assert json.loads(self.socket.recv(timeout=20)) == {"type": "ack", "seq": self.seq}

    def close(self) -> None:
        self.socket.close()


def test_a_run_judged_by_one_replica_then_another_and_back_loses_and_doubles_no_alert(
    replicas: Team,
) -> None:
    a, b = replicas.replicas
    run_id, secret = uuid.uuid4().hex, uuid.uuid4().hex

    def alerts() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = a.get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
        return found

    agent = Agent(a, run_id, secret)
    agent.send(range(1, 51), 0.5)
    agent.send(range(51, 52), float("nan"))
    agent.close()
    fired = alerts()
    assert [(x["rule"], x["state"]) for x in fired] == [("nonfinite", "firing")]

    agent = Agent(b, run_id, secret)  # B takes the run over, rebuilt from storage
    assert agent.seq == 2
    agent.send(range(52, 53), float("nan"))  # still the same incident: not raised again
    agent.send(range(53, 160), 0.5)  # 100 clean steps: it resolves, on B
    agent.close()
    resolved = alerts()
    assert [(x["id"], x["state"], x["count"]) for x in resolved] == [
        (fired[0]["id"], "resolved", 1)
    ]
    # A judged the run before: it must have let go, or it would take this NaN for the old,
    # firing incident and raise nothing.
    agent = Agent(a, run_id, secret)
    agent.send(range(160, 161), float("nan"))
    agent.close()
    again = [x for x in alerts() if x["state"] == "firing"]
    assert [(x["rule"], x["step"]) for x in again] == [("nonfinite", 160)]
    assert sum(x["count"] for x in alerts()) == 2  # fired twice in all, once per incident


def test_one_replica_sweeps_for_lost_runs_by_what_every_replica_heard(replicas: Team) -> None:
    runs = {uuid.uuid4().hex: server for server in replicas.replicas}
    agents = [Agent(server, run_id, "s") for run_id, server in runs.items()]
    for agent in agents:
        agent.send(range(1, 2), 0.5)
        agent.close()
    # Each run moves to the other replica: the one it left must not take it for silent.
    others = reversed(replicas.replicas)
    agents = [Agent(server, run_id, "s") for run_id, server in zip(runs, others, strict=True)]
    started = time.monotonic()
    step = 1
    while time.monotonic() - started < 4:  # twice TRAINVITALS_LOST_AFTER, streaming
        step += 1
        for agent in agents:
            agent.send(range(step, step + 1), 0.5)
        time.sleep(0.1)  # the pace of a training run, not a wait for the server
    api = replicas.replicas[0]
    assert [api.get(f"/api/v1/runs/{r}")["status"] for r in runs] == ["running", "running"]
    for agent in agents:  # silent from now on, without an ending
        agent.close()

    def crash_alerts(run_id: str) -> list[dict[str, Any]]:
        found = api.get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
        return [a for a in found if a["rule"] == "crash"]

    for run_id in runs:
        wait_for(partial(crash_alerts, run_id), timeout=20, what=f"{run_id} lost")
        assert api.get(f"/api/v1/runs/{run_id}")["status"] == "lost"
        assert [(a["state"], a["count"]) for a in crash_alerts(run_id)] == [("firing", 1)]


def last_step_is(server: ServerProcess, run_id: str, step: int) -> bool:
    return bool(server.get(f"/api/v1/runs/{run_id}")["last_step"] == step)


def agent_connections(server: ServerProcess) -> int:
    status, text = scrape(server, server.token)
    assert status == 200, text
    count = value(parse(text), "trainvitals_agent_connections")
    assert count is not None, text
    return int(count)


def test_the_balancer_sends_a_runs_connections_to_one_replica_and_spreads_the_rest(
    replicas: Team, tmp_path: Path
) -> None:
    """Every connection that names run X (the agent's, its watchdog's) goes to X's replica,
    so a watchdog's report of a killed process queues behind what that process sent
    (test_ingest.py); connections that name no run spread."""
    before = [agent_connections(server) for server in replicas.replicas]
    base = replicas.url.replace("http", "ws", 1) + "/api/v1/ingest"
    headers = {"Authorization": f"Bearer {replicas.token}"}

    def added() -> list[int]:
        now = [agent_connections(server) for server in replicas.replicas]
        return [after - then for after, then in zip(now, before, strict=True)]

    config = resolve(server=replicas.url, project="p", token=replicas.token, spool_dir=tmp_path)
    agent = Run(config, system_metrics=False, watchdog=False)
    agent.start()
    agent.log(1, {"loss": 1.0})
    run = urlencode({"run": agent.id})
    # A handshake through nginx took over websockets' 10 s on a loaded CI host: where each
    # connection goes is what is tested here, not how fast a busy host opens it.
    headers_and_patience: dict[str, Any] = {"additional_headers": headers, "open_timeout": 60}
    sockets = [connect(f"{base}?{run}", **headers_and_patience) for _ in range(5)]
    try:
        wait_for(lambda: sorted(added()) == [0, 6], what="the run's 6 connections on one replica")
        assert agent.finish()
        for socket in sockets:
            socket.close()
        wait_for(lambda: added() == [0, 0], what="the connections closed")
        sockets = [connect(base, **headers_and_patience) for _ in range(20)]

        def all_open() -> list[int] | None:
            counts = added()
            return counts if sum(counts) == 20 else None

        spread = wait_for(all_open, what="20 connections open")
        assert min(spread) > 0, spread  # all 20 on one replica: 2 chances in 2^20
    finally:
        agent.finish()
        for socket in sockets:
            socket.close()


def test_a_replica_killed_mid_run_loses_and_doubles_no_point(tmp_path: Path) -> None:
    with postgres_database() as db, team(db, redis_url()) as running:
        config = resolve(server=running.url, project="p", token=running.token,
                         spool_dir=tmp_path)  # fmt: skip
        run = Run(config, system_metrics=False, watchdog=False)
        run.start()
        api = running.replicas[0]
        step = 0
        # Each replica in turn is killed while the run streams through nginx, so whichever
        # one held its connection died under it.
        for victim in (0, 1):
            for _ in range(1500):
                step += 1
                run.log(step, {"loss": 1.0 / step})
            stored = partial(last_step_is, api, run.id, step)
            wait_for(stored, timeout=30, what=f"step {step} stored")
            for _ in range(500):  # in flight while the replica dies
                step += 1
                run.log(step, {"loss": 1.0 / step})
            os.kill(running.replicas[victim].process.pid, signal.SIGKILL)
            api = running.restart(victim)
        for _ in range(1000):
            step += 1
            run.log(step, {"loss": 1.0 / step})
        assert run.finish(timeout=60)
        stored = run_series(api, run.id, "loss", max_points=100_000)["loss"]["step"]
        assert stored == list(range(1, step + 1))  # none lost, none twice
        assert api.get(f"/api/v1/runs/{run.id}")["status"] == "finished"


def test_a_tokens_caps_hold_across_the_replicas_not_once_per_replica() -> None:
    """Three new runs a minute for the token, made through either replica: the fourth is
    refused by whichever replica gets it (the count is the team's, in Redis)."""
    env = {"TRAINVITALS_MAX_RUNS_PER_MINUTE": "3"}
    with postgres_database() as db, team(db, redis_url(), env=env) as capped:
        one, two = capped.replicas
        for server in (one, two, one):
            Agent(server, uuid.uuid4().hex, "s").close()
        socket = ws(two, "/api/v1/ingest")
        socket.send(json.dumps({"type": "hello", "v": 1, "run_id": uuid.uuid4().hex,
                                "project": "p", "name": "fourth", "started_at": 1.0,
                                "run_secret": "s"}))  # fmt: skip
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=20)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1013
        assert "TRAINVITALS_MAX_RUNS_PER_MINUTE" in closed.value.rcvd.reason
