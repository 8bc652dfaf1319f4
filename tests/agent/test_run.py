"""One run end to end against a scripted server: hello, points, system samples, the end."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from harness.polling import wait_for
from tests.agent.peer import Peer, running_peer
from trainvitals.agent.config import resolve
from trainvitals.agent.gpu import GpuDescription, SimulatedGpu
from trainvitals.agent.run import Run
from trainvitals.protocol import END, HELLO, POINTS, Columns, EndReason
from trainvitals.series import GRAD_GLOBAL_NORM


def server_of(peer: Peer) -> str:
    """The server URL an agent is given for the scripted peer."""
    return peer.url.replace("ws://", "http://").removesuffix("/api/v1/ingest")


def looking_run(peer: Peer, **sampling: Any) -> tuple[Run, list[int]]:
    """A started run that looks every 10 ms (adding to the list) and sends only what is
    urgent: its next regular send is an hour away."""
    config = resolve(server=server_of(peer), flush_interval=3600, read_interval=0.01)
    run = Run(config, watchdog=False, **sampling)
    looks: list[int] = []
    run.on_tick(lambda: looks.append(1))
    run.start()
    return run, looks


class Steady:
    """A system source with fixed readings."""

    name = "steady"

    def describe(self) -> GpuDescription:
        return {"gpus": []}

    def sample(self) -> dict[str, float]:
        return {"gpu0/mem_used": 1e9, "gpu0/mem_total": 8e9}


def test_a_run_says_hello_streams_its_points_and_ends_with_its_reason() -> None:
    samples: list[tuple[int, Mapping[str, float]]] = []
    with running_peer() as peer:
        config = resolve(server=server_of(peer))
        run = Run(
            config,
            system_metrics=0.05,
            gpu=Steady(),
            watchdog=False,
            on_system=lambda step, when, values: samples.append((step, values)),
        )
        run.start()
        run.log(1, {"loss": 0.9})
        run.add_columns({"loss": Columns([2, 3], [2.0, 3.0], [0.8, 0.7])})
        # System samples are filed under the latest step.
        wait_for(lambda: any(step == 3 for step, _ in samples), what="a sample at step 3")
        assert run.finish(EndReason.EXCEPTION, "Traceback: boom")
        frames = peer.frames()
    hello = frames[0]
    assert hello["type"] == HELLO and hello["run_id"] == run.id
    assert hello["project"] == config.project and hello["env"]["steady"] == {"gpus": []}
    points = [f for f in frames if f["type"] == POINTS]
    losses = [v for f in points for v in f["series"].get("loss", {}).get("value", [])]
    assert losses == [0.9, 0.8, 0.7]
    assert any("gpu0/mem_used" in f["series"] for f in points)
    end = frames[-1]
    assert (end["type"], end["reason"], end["traceback"]) == (END, "exception", "Traceback: boom")
    assert [f["seq"] for f in frames[1:]] == list(range(1, len(frames)))
    assert run.finish() is True  # a second finish is harmless


def test_an_end_sent_without_waiting_is_waited_for_by_the_next_finish_and_frees_the_watchdog() -> (
    None
):
    """The sender's own thread ends the run of a fit that an exception left, without waiting
    (``timeout=0``). The process's exit calls finish again: that call waits for the end, as a
    first one would, rather than returning at once while the end may still be unsent. The
    watchdog goes once the server has the end."""
    with running_peer() as peer:
        peer.hold_end = threading.Event()
        run = Run(resolve(server=server_of(peer)), system_metrics=False, watchdog=True)
        run.start()
        assert run._watchdog is not None
        watchdog = run._watchdog._process
        run.log(1, {"loss": 1.0})
        assert run.finish(EndReason.EXCEPTION, "Traceback: boom", timeout=0) is False
        wait_for(lambda: END in [f["type"] for f in peer.frames()], what="the end sent")
        assert run.finish(timeout=0.2) is False  # the end is not acknowledged yet
        peer.hold_end.set()
        assert run.finish(timeout=10) is True
        wait_for(lambda: watchdog.poll() is not None, what="the watchdog gone")
    assert watchdog.returncode == 0
    assert [f["type"] for f in peer.frames()].count(END) == 1


def test_a_nan_or_a_steep_gradient_rise_is_sent_at_the_next_read_not_the_next_send() -> None:
    """With an hour between sends, healthy points wait (looked at, held) and an urgent one
    leaves at the next look, taking everything recorded before it."""
    with running_peer() as peer:
        run, looks = looking_run(peer, system_metrics=False)

        def held_for_looks() -> None:
            seen = len(looks)
            wait_for(lambda: len(looks) >= seen + 3, what="three more looks")

        def sent() -> dict[str, list[int]]:
            steps: dict[str, list[int]] = {}
            for frame in peer.frames():
                if frame["type"] == POINTS:
                    for name, column in frame["series"].items():
                        steps.setdefault(name, []).extend(column["step"])
            return steps

        held_for_looks()  # the first look's send is behind us
        run.log(1, {"loss": 0.5})
        held_for_looks()
        assert sent() == {}
        run.log(2, {"loss": math.nan})
        wait_for(lambda: sent() == {"loss": [1, 2]}, what="the NaN, with the step before it")
        norms = [1.0 + 0.01 * (step % 5) for step in range(3, 43)]
        run.add_columns({GRAD_GLOBAL_NORM: Columns(list(range(3, 43)), [0.0] * 40, norms)})
        held_for_looks()
        assert GRAD_GLOBAL_NORM not in sent()
        run.add_columns({GRAD_GLOBAL_NORM: Columns([43], [0.0], [5.0])})
        held_for_looks()  # one step's spike is not a rise
        assert GRAD_GLOBAL_NORM not in sent()
        run.add_columns({GRAD_GLOBAL_NORM: Columns([44, 45], [0.0, 0.0], [6.0, 7.0])})
        rise = list(range(3, 46))
        wait_for(lambda: sent().get(GRAD_GLOBAL_NORM) == rise, what="the rise, with the rest")
        assert run.finish()
    assert len([f for f in peer.frames() if f["type"] == POINTS]) == 2  # one a send


def test_memory_racing_to_its_limit_is_sent_at_the_next_read_not_the_next_send() -> None:
    """An OOM kill takes every point not yet sent with it: a memory reading that, at its
    rate, meets its limit within seconds leaves at the next look; steady readings wait."""
    gpu = SimulatedGpu(mem_total=16e9, mem_start=2e9)
    with running_peer() as peer:
        run, looks = looking_run(peer, system_metrics=0.02, gpu=gpu)

        def sent() -> list[float]:
            return [
                value
                for frame in peer.frames()
                if frame["type"] == POINTS
                for value in frame["series"].get("gpu0/tf_current", {}).get("value", [])
            ]

        wait_for(lambda: gpu.ticks >= 10 and len(looks) >= 10, what="steady samples, looks")
        assert sent() == [] or set(sent()) == {2e9}  # the first look's send only
        before = len(sent())
        gpu.mem_growth = 1e9  # a gigabyte a sample: the card is full within a second
        wait_for(lambda: any(v > 2e9 for v in sent()), what="the climb, sent at once")
        assert len(sent()) > before + 1  # with the steady readings that waited before it
        assert run.finish()
