"""One run end to end against a scripted server: hello, points, system samples, the end."""

from __future__ import annotations

from collections.abc import Mapping

from harness.processes import wait_for
from tests.agent.peer import running_peer
from trainvitals.agent.config import resolve
from trainvitals.agent.run import Run
from trainvitals.protocol import END, HELLO, POINTS, Columns, EndReason


class Steady:
    """A system source with fixed readings."""

    name = "steady"

    def describe(self) -> dict[str, object]:
        return {"kind": "test"}

    def sample(self) -> dict[str, float]:
        return {"gpu0/mem_used": 1e9, "gpu0/mem_total": 8e9}


def test_a_run_says_hello_streams_its_points_and_ends_with_its_reason() -> None:
    samples: list[tuple[int, Mapping[str, float]]] = []
    with running_peer() as peer:
        config = resolve(server=peer.url.replace("ws://", "http://").removesuffix("/api/v1/ingest"))
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
    assert hello["project"] == config.project and hello["env"]["steady"] == {"kind": "test"}
    points = [f for f in frames if f["type"] == POINTS]
    losses = [v for f in points for v in f["series"].get("loss", {}).get("value", [])]
    assert losses == [0.9, 0.8, 0.7]
    assert any("gpu0/mem_used" in f["series"] for f in points)
    end = frames[-1]
    assert (end["type"], end["reason"], end["traceback"]) == (END, "exception", "Traceback: boom")
    assert [f["seq"] for f in frames[1:]] == list(range(1, len(frames)))
    assert run.finish() is True  # a second finish is harmless
