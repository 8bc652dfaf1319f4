"""Bad input closes only the offending connection, with a code and a reason: what needs a real
server (uvicorn's own frame limit, agents, watchdogs, the upgrade). Each frame the session
refuses, and the caps, are tested in this process: tests/server/test_ingest.py."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from harness.metrics import parse, scrape, value
from harness.polling import wait_for
from harness.processes import ServerProcess, run_series
from trainvitals import Run, resolve
from trainvitals.agent.buffer import encode_points, points_frames
from trainvitals.protocol import MAX_FRAME_BYTES, Columns

HELLO = {
    "type": "hello",
    "v": 1,
    "run_id": "bad1",
    "project": "p",
    "name": "bad",
    "started_at": 1.0,
}


def closed_with(ws: ClientConnection) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as info:
        while True:
            ws.recv(timeout=10)
    assert info.value.rcvd is not None, "the server must send a close frame"
    return info.value.rcvd.code, info.value.rcvd.reason


def ingest(server: ServerProcess) -> ClientConnection:
    return connect(server.url.replace("http", "ws") + "/api/v1/ingest", max_size=None)


def test_oversized_frame_closes_with_1009(server: ServerProcess) -> None:
    """uvicorn lets a frame over the limit through, so that the session closes it with a
    reason rather than uvicorn with none."""
    with ingest(server) as ws:
        ws.send(json.dumps(HELLO))
        ws.recv(timeout=10)
        ws.send('{"type": "points", "v": 1, "seq": 1, "pad": "' + "x" * MAX_FRAME_BYTES + '"}')
        code, reason = closed_with(ws)
    assert code == 1009 and "exceeds the 4194304-byte limit" in reason


def test_other_runs_carry_on_while_bad_connections_are_closed(server: ServerProcess) -> None:
    good = Run(resolve(server=server.url, run_name="good"))
    good.start()
    good.log(1, {"loss": 1.0})
    for bad in ("{not json", '{"type": "points", "v": 1, "seq": 1, "series": {}}'):
        with ingest(server) as ws:
            ws.send(bad)
            closed_with(ws)
    good.log(2, {"loss": 0.5})
    assert good.finish()
    run = server.get(f"/api/v1/runs/{good.id}")
    assert run["status"] == "finished"
    assert server.get(f"/api/v1/runs/{good.id}/series?name=loss")["series"]["loss"]["step"] == [
        1,
        2,
    ]


def test_points_sent_with_clocks_are_stored_as_the_same_points_sent_without(
    server: ServerProcess,
) -> None:
    steps = list(range(1, 301))
    times = [1795317434.000001 + 0.002 * s for s in steps]
    series = {
        "loss": Columns(steps, times, [1.0 / s for s in steps]),
        "lr": Columns(steps, times, [1e-3 for _ in steps]),
        "nonfinite/grads": Columns(steps, times, [float("nan") if s == 7 else 0.0 for s in steps]),
        "host/rss": Columns([300], [times[-1]], [7e8]),
    }
    for run_id, clocks in (("plain", False), ("clocked", True)):
        with ingest(server) as ws:
            ws.send(json.dumps({**HELLO, "run_id": run_id}))
            assert json.loads(ws.recv(timeout=10))["features"] == ["clocks"]
            [frame] = points_frames(series, first_seq=1, clocks=clocks)
            assert ("clocks" in frame) is clocks
            ws.send(encode_points(frame))
            assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": 1}
    names = list(series)
    plain, clocked = (run_series(server, r, *names) for r in ("plain", "clocked"))
    assert json.dumps(clocked, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert clocked["lr"]["step"] == steps and len(clocked["lr"]["value"]) == 300
    assert clocked["nonfinite/grads"]["value"][6] is None  # NaN, as the API writes it


def test_a_huge_body_gets_413_before_it_is_sent_and_the_server_stays_responsive(
    server: ServerProcess,
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.putrequest("POST", "/api/v1/alerts/x/silence")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(60 * 2**20))  # the 60 MB that froze it before
    connection.endheaders()  # the answer comes before a byte of the body
    response = connection.getresponse()
    assert response.status == 413 and response.read() == b"request body too large"
    connection.close()
    assert server.get("/healthz") == {"status": "ok", "writer": "ok"}


def test_a_watchdog_waits_for_a_process_killed_while_its_hello_was_queued(
    postgres_url: str, tmp_path: Path
) -> None:
    """An out-of-memory kill at the first batch: the dead process's ``hello`` still waits
    behind the writer (held here by a lock on the runs table) when its watchdog's arrives. The
    watchdog waits for that connection too, so its ``end`` is numbered after the frames the
    process sent after its hello, and they are stored, not taken for replays."""
    import psycopg

    server = ServerProcess(postgres_url)
    owned = {**HELLO, "run_id": "oom", "run_secret": "the agent's own"}
    lock = psycopg.connect(postgres_url)
    try:
        lock.execute("LOCK TABLE runs IN EXCLUSIVE MODE")  # reads go on, writes wait
        dead = ingest(server)
        dead.send(json.dumps(owned))
        for seq in (1, 2, 3):
            columns = {"step": [seq], "time": [float(seq)], "value": [0.5]}
            dead.send(json.dumps({"type": "points", "v": 1, "seq": seq,
                                  "series": {"loss": columns}}))  # fmt: skip
        dead.socket.shutdown(socket.SHUT_WR)  # killed: what it sent is all there is
        with psycopg.connect(postgres_url, autocommit=True) as probe:

            def writer_waits() -> bool:
                waiting = probe.execute(
                    "SELECT count(*) FROM pg_locks"
                    " WHERE NOT granted AND relation = 'runs'::regclass"
                ).fetchone()
                return waiting is not None and waiting[0] >= 1

            wait_for(writer_waits, what="the dead process's hello waiting on the lock")
        watchdog = ingest(server)
        watchdog.send(json.dumps({**owned, "watchdog": True}))

        def held() -> bool:  # waiting for the dead connection, or (before) queued for a write
            samples = parse(scrape(server, None)[1])
            return bool(value(samples, "trainvitals_watchdogs_waiting")) or bool(
                value(samples, "trainvitals_writer_queue_depth")
            )

        wait_for(held, what="the watchdog's hello waiting")
        lock.commit()  # the writer goes on
        seq = json.loads(watchdog.recv(timeout=60))["last_seq"] + 1
        end = {"type": "end", "v": 1, "seq": seq, "reason": "oom_killed", "time": 2.0e9}
        watchdog.send(json.dumps(end))
        assert json.loads(watchdog.recv(timeout=60)) == {"type": "ack", "seq": seq}
        watchdog.close()
        dead.socket.close()
        run = server.get("/api/v1/runs/oom")
        assert (run["status"], run["end_reason"]) == ("crashed", "oom_killed"), run
        assert seq == 4 and run["last_step"] == 3
    finally:
        lock.close()
        server.stop()


def test_a_page_of_another_origin_cannot_open_the_websockets(server: ServerProcess) -> None:
    """Nor a page whose origin is opaque (``Origin: null``): a sandboxed frame that any site
    can embed, or a file opened from disk, would otherwise read and write a local server that
    runs without auth."""
    for path in ("/api/v1/live", "/api/v1/ingest"):
        url = server.url.replace("http", "ws") + path
        for foreign in ("http://evil.example", "null"):
            with pytest.raises(InvalidStatus) as refused:
                connect(url, origin=Origin(foreign))
            assert refused.value.response.status_code == 403, foreign  # before it opens
        with connect(url, origin=Origin(server.url)) as ws:  # the dashboard's own page
            ws.send(json.dumps({"type": "subscribe", "run_id": "x"}))


def test_a_watchdogs_end_waits_for_the_dead_processs_last_frames(server: ServerProcess) -> None:
    """A killed process's last frames may still be queued on the server when its watchdog
    says hello: the watchdog's ``end`` is numbered after them, and none is lost."""
    owned = {**HELLO, "run_id": "killed", "run_secret": "the agent's own"}
    dead = ingest(server)
    dead.send(json.dumps(owned))
    assert json.loads(dead.recv(timeout=10))["last_seq"] == 0
    frames = 1000  # each stored before the next is read: seconds of work queued
    for seq in range(1, frames + 1):
        columns = {"step": [seq], "time": [float(seq)], "value": [0.5]}
        dead.send(json.dumps({"type": "points", "v": 1, "seq": seq, "series": {"loss": columns}}))
    dead.socket.shutdown(socket.SHUT_WR)  # the process is gone: its frames are all it sent
    with ingest(server) as watchdog:
        watchdog.send(json.dumps({**owned, "watchdog": True}))
        seq = json.loads(watchdog.recv(timeout=60))["last_seq"] + 1
        end = {"type": "end", "v": 1, "seq": seq, "reason": "signal:SIGKILL", "time": 2.0e9}
        watchdog.send(json.dumps(end))
        assert json.loads(watchdog.recv(timeout=60)) == {"type": "ack", "seq": seq}
    dead.socket.close()
    run = server.get("/api/v1/runs/killed")
    assert (run["status"], run["end_reason"]) == ("crashed", "signal:SIGKILL"), run
    assert seq == frames + 1 and run["last_step"] == frames
