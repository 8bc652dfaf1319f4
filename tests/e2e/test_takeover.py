"""A run is written only by the process that created it (#15): a second client that says
hello with another run's id is refused, and the run loses nothing."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from harness.polling import wait_for
from harness.processes import ServerProcess, run_series
from trainvitals import Run, resolve


def test_another_client_cannot_take_a_run_over_nor_forge_its_end(server: ServerProcess) -> None:
    run = Run(resolve(server=server.url, project="p"), system_metrics=False, watchdog=False)
    run.start()
    for step in range(1, 101):
        run.log(step, {"loss": 1.0 / step})
    wait_for(lambda: server.get(f"/api/v1/runs/{run.id}")["last_step"] == 100, what="steps")
    attacker = connect(server.url.replace("http", "ws") + "/api/v1/ingest")
    hello = {"type": "hello", "v": 1, "run_id": run.id, "project": "p", "name": "evil",
             "started_at": 1.0}  # fmt: skip
    forged_end = {"type": "end", "v": 1, "seq": 2**63 - 1, "reason": "exception", "time": 2.0,
                  "traceback": "forged"}  # fmt: skip
    with attacker, pytest.raises(ConnectionClosed) as closed:
        attacker.send(json.dumps(hello))
        attacker.send(json.dumps(forged_end))
        attacker.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "belongs to another process" in closed.value.rcvd.reason
    # The honest run carries on; everything it sends is stored, and it ends as it says.
    for step in range(101, 201):
        run.log(step, {"loss": 1.0 / step})
    assert run.finish()
    stored = server.get(f"/api/v1/runs/{run.id}")
    assert (stored["status"], stored["end_reason"], stored["name"]) == (
        "finished",
        "completed",
        run.config.run_name,
    )
    assert stored["traceback"] is None
    loss = run_series(server, run.id, "loss")["loss"]
    assert loss["step"] == list(range(1, 201))
    assert server.get(f"/api/v1/runs/{run.id}/alerts")["alerts"] == []
