"""Nothing lost: a server that restarts mid-run, a server that is down when training starts."""

from __future__ import annotations

from pathlib import Path

from harness.polling import wait_for
from harness.processes import ServerProcess, free_port, run_series
from trainvitals import Run, resolve

STEPS = 300


def stored_steps(server: ServerProcess, run_id: str) -> list[int]:
    return list(run_series(server, run_id, "loss")["loss"]["step"])


def test_server_restart_mid_run_stores_every_point_exactly_once(tmp_path: Path) -> None:
    port, db = free_port(), str(tmp_path / "tv.db")
    server = ServerProcess(db, port=port)
    run = Run(resolve(server=server.url, run_name="restart"), system_metrics=False, watchdog=False)
    run.start()
    try:
        for step in range(1, STEPS // 2 + 1):
            run.log(step, {"loss": 1.0 / step})
        wait_for(lambda: len(stored_steps(server, run.id)) == STEPS // 2, what="first half")
        server.stop()  # the server goes away mid-run ...
        for step in range(STEPS // 2 + 1, STEPS + 1):
            run.log(step, {"loss": 1.0 / step})  # ... while training goes on
        server = ServerProcess(db, port=port)  # ... and comes back on the same address
        wait_for(
            lambda: len(stored_steps(server, run.id)) == STEPS,
            timeout=60,
            what="the agent to reconnect and replay",
        )
        assert run.finish()
        steps = stored_steps(server, run.id)
        assert steps == list(range(1, STEPS + 1))  # all of them, once each, in order
        assert server.get(f"/api/v1/runs/{run.id}")["status"] == "finished"
    finally:
        server.stop()


def test_training_that_starts_before_the_server_loses_nothing(tmp_path: Path) -> None:
    port = free_port()
    run = Run(
        resolve(server=f"http://127.0.0.1:{port}", run_name="early"),
        system_metrics=False,
        watchdog=False,
    )
    run.start()
    for step in range(1, STEPS + 1):
        run.log(step, {"loss": 1.0 / step})
    server = ServerProcess(str(tmp_path / "tv.db"), port=port)
    try:
        wait_for(
            lambda: server.get("/api/v1/runs")["runs"],
            timeout=60,
            what="the agent to find the server",
        )
        wait_for(lambda: len(stored_steps(server, run.id)) == STEPS, timeout=60, what="every point")
        assert stored_steps(server, run.id) == list(range(1, STEPS + 1))
        assert run.finish()
    finally:
        server.stop()


def test_a_long_outage_spills_to_the_spool_and_replays_every_point_once(tmp_path: Path) -> None:
    port, spool_dir = free_port(), tmp_path / "spool"
    run = Run(
        resolve(
            server=f"http://127.0.0.1:{port}",
            run_name="outage",
            spool_dir=spool_dir,
            spool_after_bytes=2**20,  # about half a frame of 50,000 points in memory
            spool_max_bytes=64 * 2**20,  # 4 MiB segments
        ),
        system_metrics=False,
        watchdog=False,
    )
    run.start()
    steps = 60_000  # x 5 series = 6 frames of 50,000 points, most of them spooled
    for step in range(1, steps + 1):
        run.log(step, {"loss": 1.0 / step, "a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})

    def spooled() -> list[Path]:
        segments = list(spool_dir.glob("*/*.seg"))
        return segments if len(segments) >= 2 else []

    segments = wait_for(spooled, what="frames beyond the in-memory limit to go to the spool")
    assert sum(f.stat().st_size for f in segments) > 4 * 2**20
    server = ServerProcess(str(tmp_path / "tv.db"), port=port)
    try:
        wait_for(
            lambda: len(stored_steps(server, run.id)) == steps,
            timeout=120,
            what="the spool to be replayed",
        )
        assert run.finish()
        assert stored_steps(server, run.id) == list(range(1, steps + 1))
        assert server.get(f"/api/v1/runs/{run.id}")["status"] == "finished"
        assert list(spool_dir.iterdir()) == []  # the run's spool is gone with it
    finally:
        server.stop()
