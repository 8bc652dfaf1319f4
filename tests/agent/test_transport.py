"""The sender thread against a scripted server: order, acks, resends, the end frame."""

from __future__ import annotations

import logging
import math
import random
from functools import partial
from typing import Any

import pytest
from websockets.sync.client import connect

from harness.polling import wait_for
from tests.agent.peer import running_peer
from trainvitals.agent.buffer import PointBuffer
from trainvitals.agent.connection import KeepaliveConnection
from trainvitals.agent.transport import Sender
from trainvitals.protocol import END, HELLO, POINTS, Columns, HelloFrame


def hello() -> HelloFrame:
    return {
        "type": HELLO,
        "v": 1,
        "run_id": "r1",
        "project": "p",
        "name": "n",
        "config": {},
        "host": "h",
        "pid": 1,
        "started_at": 0.0,
        "env": {},
        "job": None,
        "run_secret": "s3cret-of-the-run",
    }


def test_frames_go_in_order_after_the_hello_and_the_end_comes_last() -> None:
    with running_peer() as peer:
        buffer = PointBuffer()
        sender = Sender(peer.url, hello(), buffer, flush_interval=0.02, token="s3cret")
        sender.start()
        buffer.add(1, 10.0, {"loss": 0.9})
        wait_for(lambda: peer.numbered() == [1], what="the first points frame")
        buffer.add(2, 11.0, {"loss": 0.8})
        assert sender.close("completed", 12.0, None, timeout=10)
        frames = peer.frames()
    assert [f["type"] for f in frames] == [HELLO, POINTS, POINTS, END]
    assert [f.get("seq") for f in frames] == [None, 1, 2, 3]
    assert frames[2]["series"]["loss"] == {"step": [2], "time": [11.0], "value": [0.8]}
    assert (frames[3]["reason"], frames[3]["time"], frames[3]["traceback"]) == (
        "completed",
        12.0,
        None,
    )
    assert peer.authorizations == ["Bearer s3cret"]
    assert sender.unacknowledged == 0


def test_an_unacknowledged_frame_is_sent_again_after_a_reconnect() -> None:
    with running_peer() as peer:
        peer.drop_at = 2  # frame 2 arrives, the connection drops before its ack
        buffer = PointBuffer()
        sender = Sender(peer.url, hello(), buffer, flush_interval=0.02)
        sender.start()

        def reached(count: int) -> bool:
            return len(set(peer.numbered())) >= count

        for step in (1, 2, 3):
            buffer.add(step, float(step), {"loss": 1.0 / step})
            wait_for(partial(reached, step), what=f"frame {step}")
        assert sender.close("completed", 4.0, None, timeout=10)
    assert len(peer.connections) == 2
    stored = sorted({seq for seq in peer.numbered()})
    assert stored == [1, 2, 3, 4]  # nothing lost
    second = [f.get("seq") for f in peer.connections[1]]
    assert second[0] is None and second[1] == 2  # resent from the first unacknowledged one


def test_reconnects_and_keepalive_pings_draw_nothing_from_the_shared_random_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In the training process, :mod:`random`'s shared generator is the user's: seeded by
    ``keras.utils.set_random_seed``, and the source of each unseeded Keras initializer's seed.
    The sender's reconnect jitter and its connection's keepalive pings (websockets draws their
    payloads from it) would make a seeded run's next layer depend on the network's timing."""
    pings: list[object] = []
    ping = KeepaliveConnection.ping

    def counted(self: KeepaliveConnection, *args: Any, **options: Any) -> Any:
        pings.append(self)
        return ping(self, *args, **options)

    monkeypatch.setattr(KeepaliveConnection, "ping", counted)
    random.seed(7)
    state = random.getstate()
    with running_peer() as peer:
        peer.drop_at = 1  # dropped before its ack: the sender waits a jittered delay, reconnects
        buffer = PointBuffer()
        sender = Sender(peer.url, hello(), buffer, flush_interval=0.02, keepalive=0.02)
        sender.start()
        buffer.add(1, 1.0, {"loss": 1.0})
        wait_for(lambda: len(peer.connections) >= 2, what="the reconnect")
        wait_for(lambda: len(pings) >= 3, what="three keepalive pings")
        assert sender.close("completed", 2.0, None, timeout=10)
        with connect(peer.url, create_connection=KeepaliveConnection) as ws:
            waiting = [ws.ping() for _ in range(3)]  # sent together: a payload still awaiting
            # its pong may not be sent again (websockets refuses it)
            assert all(pong.wait(5) for pong in waiting)
    assert random.getstate() == state


def test_a_server_that_does_not_welcome_is_reported_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with running_peer() as peer:
        peer.welcome_override = {"type": "nonsense"}
        buffer = PointBuffer()
        sender = Sender(peer.url, hello(), buffer, flush_interval=0.02)
        with caplog.at_level(logging.WARNING, logger="trainvitals"):
            sender.start()
            buffer.add(1, 1.0, {"loss": 1.0})
            wait_for(lambda: len(peer.connections) >= 2, what="a second attempt")
            assert not sender.close("completed", 2.0, None, timeout=0.2)
    outages = [r for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(outages) == 1 and "welcome" in outages[0].getMessage()


def test_clocks_go_only_to_a_server_that_reads_them_even_when_packed_for_one() -> None:
    with running_peer() as peer:
        # The first server reads clocks and drops frame 2 unacknowledged; the one the agent
        # reconnects to (an older version, after a rollback) does not read them.
        peer.features = [["clocks"], []]
        peer.drop_at = 2
        buffer = PointBuffer()
        sender = Sender(peer.url, hello(), buffer, flush_interval=0.02)
        sender.start()
        for seq in (1, 2):
            steps, times = [2 * seq - 1, 2 * seq], [10.0 * seq, 10.0 * seq + 1]
            values = [0.5, 0.25]
            buffer.add_columns({name: Columns(steps, times, values) for name in ("loss", "lr")})
            wait_for(partial(lambda n: n in peer.numbered(), seq), what=f"frame {seq}")
        wait_for(lambda: len(peer.connections) == 2, what="the reconnect")
        assert sender.close("completed", 30.0, None, timeout=10)
    first, second = peer.connections
    assert [f.get("seq") for f in first] == [None, 1, 2]
    assert first[2]["clocks"] == {"0": {"step": [3, 4], "time": [20.0, 21.0]}}
    assert first[2]["series"]["loss"] == {"clock": "0", "value": [0.5, 0.25]}
    assert [f.get("seq") for f in second] == [None, 2, 3]
    assert "clocks" not in second[1]  # packed with them, sent without
    assert second[1]["series"] == {
        name: {"step": [3, 4], "time": [20.0, 21.0], "value": [0.5, 0.25]}
        for name in ("loss", "lr")
    }


def looking_sender(url: str, buffer: PointBuffer, looks: list[int]) -> Sender:
    """A sender that looks every 10 ms (adding to ``looks``) and sends only what is urgent:
    its next regular send is an hour away."""
    return Sender(
        url, hello(), buffer, flush_interval=3600, read_interval=0.01, tick=lambda: looks.append(1)
    )


def test_points_wait_for_the_flush_interval_unless_the_buffer_is_urgent() -> None:
    with running_peer() as peer:
        buffer = PointBuffer()
        looks: list[int] = []
        sender = looking_sender(peer.url, buffer, looks)
        sender.start()
        wait_for(lambda: len(looks) >= 1, what="the sender's first look")
        buffer.add(1, 10.0, {"loss": 0.9})
        seen = len(looks)
        wait_for(lambda: len(looks) >= seen + 5, what="five looks at the new point")
        assert peer.numbered() == []  # looked at, held: the next send is an hour away
        buffer.add(2, 11.0, {"loss": math.nan})
        sender.hurry()
        wait_for(lambda: peer.numbered() == [1], what="the urgent frame")
        assert sender.close("completed", 12.0, None, timeout=10)
        frames = peer.frames()
    assert frames[1]["series"]["loss"]["step"] == [1, 2]  # what waited goes with it, in order
    assert not buffer.urgent


def test_urgent_points_in_an_outage_go_to_the_spool_without_cutting_the_backoff_short() -> None:
    """A NaN at every step of a custom loop marks the buffer urgent at every step: during an
    outage that must not turn into a reconnection at every step."""
    with running_peer() as peer:
        peer.welcome_override = {"type": "nonsense"}  # every connection fails
        buffer = PointBuffer()
        looks: list[int] = []
        sender = looking_sender(peer.url, buffer, looks)
        sender.start()
        wait_for(lambda: len(peer.connections) >= 1, what="the first attempt")
        for step in range(40):
            seen = len(looks)
            buffer.add(step, float(step), {"loss": math.nan})
            sender.hurry()
            wait_for(lambda: len(looks) > seen, what="a look")  # noqa: B023
        assert len(peer.connections) <= 12, len(peer.connections)  # one a step: 40
        assert len(buffer) == 0  # each point left for the pending frames at its look
        assert not sender.close("completed", 50.0, None, timeout=0.2)
