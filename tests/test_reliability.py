"""Nothing lost: a server that restarts mid-run, a server that is down when training starts."""

from __future__ import annotations

from pathlib import Path

from trainvitals import Run, resolve

from tests.helpers import ServerProcess, free_port, run_series, wait_for

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
