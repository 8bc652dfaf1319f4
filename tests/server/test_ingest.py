"""An agent's connection in this process: each bad frame closes only its own connection, with
a code and a reason; caps, run ownership and replays, as the agent and the API see them.

The same ingest route and session a real server runs, on a real SQLite file through the real
writer; tests/e2e keeps what needs a server process (the upgrade and its refusals, agents).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from harness.inprocess import (
    HELLO,
    app_state,
    closed_after,
    closed_with,
    in_process,
    ingest,
    live,
    points,
    reply,
    send,
)
from harness.polling import wait_for
from trainvitals.server.settings import Settings

pytestmark = pytest.mark.timeout(60)  # a close that never comes fails here, not in 5 minutes


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with in_process(Settings(db=str(tmp_path / "tv.db"), max_frame_bytes=4096)) as client:
        yield client


def series_of(client: TestClient, run_id: str, name: str) -> dict[str, list[object]]:
    answer = client.get(f"/api/v1/runs/{run_id}/series", params={"name": name})
    assert answer.status_code == 200, answer.text
    found: dict[str, list[object]] = answer.json()["series"][name]
    return found


LOSS_X = ('{"type": "points", "v": 1, "seq": 1, "series": {"loss": '
          '{"step": [1], "time": [1.0], "value": ["x"]}}}')  # fmt: skip
UNKNOWN_CLOCK = ('{"type": "points", "v": 1, "seq": 1, "clocks": {}, "series": {"loss": '
                 '{"clock": "0", "value": [1.0]}}}')  # fmt: skip
NO_HELLO = '{"type": "points", "v": 1, "seq": 1, "series": {}}'
BAD_JOB = json.dumps({**HELLO, "job": {"key": "", "worker": "worker:0"}})
FAR_AHEAD = json.dumps(points(10**7 + 1, {"loss": ([1], [1.0])}))


@pytest.mark.parametrize(
    ("frames", "code", "reason"),
    [
        (["{not json"], 1007, "not valid JSON"),
        ([b"\x00\x01binary"], 1003, "expected JSON text frames"),
        (['{"type": "hello", "v": 9}'], 1007, "unsupported protocol version 9"),
        ([NO_HELLO], 1008, "expected a 'hello' frame first"),
        ([json.dumps(HELLO), LOSS_X], 1007, "invalid points frame at series.loss.value.0"),
        ([json.dumps(HELLO), UNKNOWN_CLOCK], 1007, "names a clock the frame does not hold"),
        ([json.dumps(HELLO), json.dumps(HELLO)], 1008, "one run only"),
        ([BAD_JOB], 1007, "invalid hello frame at job.key"),
        ([json.dumps({**HELLO, "started_at": 1e300})], 1007, "started_at"),
        ([json.dumps(HELLO), FAR_AHEAD], 1007, "seq 10000001 is more than 10000000 ahead"),
    ],
)
def test_malformed_frames_close_with_code_and_reason(
    client: TestClient, frames: list[str | bytes], code: int, reason: str
) -> None:
    with ingest(client) as ws:
        got_code, got_reason = closed_after(ws, *frames)
    assert got_code == code
    assert reason in got_reason


def test_an_oversized_frame_closes_with_1009_and_other_runs_carry_on(client: TestClient) -> None:
    with ingest(client) as good:
        assert reply(good, HELLO)["type"] == "welcome"
        with ingest(client) as big:
            assert reply(big, {**HELLO, "run_id": "big"})["type"] == "welcome"
            send(big, {"type": "points", "v": 1, "seq": 1, "pad": "x" * 4096})
            code, reason = closed_with(big)
            assert code == 1009 and reason.endswith("bytes exceeds the 4096-byte limit")
        assert reply(good, points(1, {"loss": ([1], [0.5])})) == {"type": "ack", "seq": 1}
    assert series_of(client, "r1", "loss")["value"] == [0.5]


def test_a_long_reason_is_cut_to_what_a_close_frame_holds(client: TestClient) -> None:
    with ingest(client) as ws:
        reply(ws, HELLO)
        send(ws, {"type": "points", "v": 1, "seq": 1,
                  "series": {"é" * 100: {"step": [1], "time": [1.0], "value": ["x"]}}})  # fmt: skip
        code, reason = closed_with(ws)
    assert code == 1007 and len(reason.encode()) <= 123 and reason.endswith("...")


def test_a_connection_that_never_says_hello_is_closed(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "tv.db"), hello_timeout=0.2)
    with in_process(settings) as client, ingest(client) as ws:
        assert closed_with(ws) == (1008, "expected a 'hello' within 0.2 s")


def test_the_welcome_reports_what_is_stored_and_replays_are_acked_not_stored_twice(
    client: TestClient,
) -> None:
    owned = {**HELLO, "run_secret": "the agent's own"}  # as the agent sends it
    frame = points(1, {"loss": ([1], [0.3])})
    with ingest(client) as ws:
        assert reply(ws, owned) == {"type": "welcome", "v": 1, "run_id": "r1", "last_seq": 0,
                                    "features": ["clocks"]}  # fmt: skip
        assert reply(ws, frame) == {"type": "ack", "seq": 1}
        assert reply(ws, frame) == {"type": "ack", "seq": 1}  # a replay on the same connection
    with ingest(client) as ws:  # the agent reconnects and replays frame 1
        assert reply(ws, owned)["last_seq"] == 1
        assert reply(ws, frame) == {"type": "ack", "seq": 1}
        assert reply(ws, points(2, {"loss": ([2], [0.2])})) == {"type": "ack", "seq": 2}
    loss = series_of(client, "r1", "loss")
    assert loss["step"] == [1, 2] and loss["value"] == [0.3, 0.2]


def test_a_run_is_written_only_by_the_process_that_created_it(client: TestClient) -> None:
    with ingest(client) as ws:
        welcome = reply(ws, HELLO)  # a new run: the server issues its secret
        secret = welcome["run_secret"]
        assert reply(ws, points(1, {"loss": ([1], [0.5])})) == {"type": "ack", "seq": 1}
    forged_end = {"type": "end", "v": 1, "seq": 2**63 - 1, "reason": "exception", "time": 2.0}
    for hello, why in (
        (HELLO, "belongs to another process: its hello lacks the run's secret"),
        ({**HELLO, "project": "q", "run_secret": secret}, "is not of project 'q'"),
    ):
        with ingest(client) as attacker:
            send(attacker, hello)
            send(attacker, forged_end)
            code, reason = closed_with(attacker)
        assert code == 1008 and why in reason, reason
    with ingest(client) as ws:  # the owner carries on
        assert reply(ws, {**HELLO, "run_secret": secret})["last_seq"] == 1
    run = client.get("/api/v1/runs/r1").json()
    assert (run["status"], run["project"], run["end_reason"]) == ("running", "p", None)


def test_a_run_with_too_many_series_is_closed_and_others_carry_on(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "tv.db"), max_series_per_run=3)
    with in_process(settings) as client, ingest(client) as honest:
        assert reply(honest, HELLO)["type"] == "welcome"
        with ingest(client) as greedy:
            reply(greedy, {**HELLO, "run_id": "greedy"})
            send(greedy, points(1, {f"s{i}": ([1], [1.0]) for i in range(4)}))
            code, reason = closed_with(greedy)
        assert code == 1008 and "MAX_SERIES_PER_RUN" in reason
        assert reply(honest, points(1, {"loss": ([1], [1.0])})) == {"type": "ack", "seq": 1}


def test_each_tokens_connections_runs_and_bytes_are_capped(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "tv.db"), max_connections=1, max_runs_per_minute=2)
    with in_process(settings) as client:
        with ingest(client) as first:
            secret = reply(first, HELLO)["run_secret"]
            with ingest(client) as second:
                code, reason = closed_with(second)
            assert code == 1013 and "MAX_CONNECTIONS" in reason
        with ingest(client) as ws:  # its slot is free again, and a known run is no new run
            assert reply(ws, {**HELLO, "run_secret": secret})["type"] == "welcome"
        with ingest(client) as ws:
            assert reply(ws, {**HELLO, "run_id": "r2"})["type"] == "welcome"
        with ingest(client) as ws:
            send(ws, {**HELLO, "run_id": "r3"})
            code, reason = closed_with(ws)
        assert code == 1013 and "MAX_RUNS_PER_MINUTE" in reason
    settings = Settings(db=str(tmp_path / "bytes.db"), max_bytes_per_day=150)  # the hello fits
    with in_process(settings) as client, ingest(client) as ws:
        reply(ws, HELLO)
        send(ws, points(1, {"loss": ([1, 2, 3, 4, 5], [1.0] * 5)}))
        code, reason = closed_with(ws)
    assert code == 1013 and "MAX_BYTES_PER_DAY" in reason


def test_a_token_sends_runs_of_its_own_project_only(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "tv.db"), auth="required")
    with in_process(settings) as client:
        tokens = app_state(client).store.tokens
        of_p, of_all = tokens.create("a", "p", "ingest"), tokens.create("b", "*", "ingest")
        with ingest(client, of_p) as ws:
            send(ws, {**HELLO, "project": "q"})
            assert closed_with(ws) == (1008, "this token may not send runs of project 'q'")
        for token in (of_p, of_all):
            with ingest(client, token) as ws:
                assert reply(ws, {**HELLO, "run_id": token[:8]})["type"] == "welcome"


def test_a_runs_frames_move_it_through_stalled_running_and_its_end(client: TestClient) -> None:
    def run() -> dict[str, object]:
        answer: dict[str, object] = client.get("/api/v1/runs/r1").json()
        return answer

    stall = {"type": "stall", "v": 1, "seq": 2, "time": 5.0, "idle": 40.0, "threshold": 10.0,
             "stacks": "Thread 1:\n  next(iterator)"}  # fmt: skip
    end = {"type": "end", "v": 1, "seq": 4, "reason": "completed", "time": 9.0}
    with ingest(client) as ws:
        reply(ws, HELLO)
        reply(ws, points(1, {"loss": ([1, 2], [1.0, 0.9])}))
        assert reply(ws, stall) == {"type": "ack", "seq": 2}
        assert (run()["status"], run()["last_step"]) == ("stalled", 2)
        reply(ws, points(3, {"loss": ([3], [0.8])}))  # a step: it runs again
        assert (run()["status"], run()["last_step"]) == ("running", 3)
        seen = run()["last_seen"]
        send(ws, {"type": "heartbeat", "v": 1, "time": 8.0})  # not numbered, not acked
        assert reply(ws, points(3, {"loss": ([3], [0.8])})) == {"type": "ack", "seq": 3}  # replay
        seen_again = run()["last_seen"]
        assert isinstance(seen, float) and isinstance(seen_again, float) and seen_again > seen
        assert reply(ws, end) == {"type": "ack", "seq": 4}
        assert reply(ws, end) == {"type": "ack", "seq": 4}  # a replayed end changes nothing
    ended = run()
    assert (ended["status"], ended["end_reason"], ended["ended_at"]) == ("finished", "completed",
                                                                         9.0)  # fmt: skip


def test_a_run_given_up_as_lost_comes_back_when_its_points_arrive(tmp_path: Path) -> None:
    """Silent longer than ``lost_after`` yet connected all along (a network hiccup, a paused
    server): its next points make it run again, and its crash alert resolves."""
    settings = Settings(db=str(tmp_path / "tv.db"), lost_after=0.5)
    with in_process(settings) as client, ingest(client) as ws:
        reply(ws, HELLO)
        reply(ws, points(1, {"loss": ([1], [1.0])}))
        wait_for(lambda: client.get("/api/v1/runs/r1").json()["status"] == "lost", what="lost")
        assert reply(ws, points(2, {"loss": ([2], [0.9])})) == {"type": "ack", "seq": 2}
        back = client.get("/api/v1/runs/r1").json()
        assert (back["status"], back["end_reason"], back["ended_at"]) == ("running", None, None)
        (crash,) = client.get("/api/v1/runs/r1/alerts").json()["alerts"]
        assert (crash["rule"], crash["state"]) == ("crash", "resolved")


def test_past_max_websockets_an_upgrade_is_answered_503_until_one_closes(tmp_path: Path) -> None:
    with in_process(Settings(db=str(tmp_path / "tv.db"), max_websockets=1)) as client:
        with ingest(client) as first:
            assert reply(first, HELLO)["type"] == "welcome"
            for connect in (ingest, live):  # agents and browsers count together
                with pytest.raises(WebSocketDenialResponse) as refused, connect(client):
                    pass
                assert refused.value.status_code == 503
                assert "too many connections" in refused.value.json()["detail"]
        with ingest(client) as again:  # the first one's place is free
            assert reply(again, {**HELLO, "run_id": "r2"})["type"] == "welcome"
