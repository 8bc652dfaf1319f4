"""The workers of one real multi-worker TensorFlow job are linked into one job."""

from __future__ import annotations

import subprocess
import sys

from harness.processes import ROOT, ServerProcess, free_port, run_series


def test_the_workers_of_a_multi_worker_job_are_one_job(server: ServerProcess) -> None:
    ports = f"{free_port()},{free_port()}"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.multi_worker", str(index), ports, server.url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(2)
    ]
    for worker in workers:
        output, _ = worker.communicate(timeout=240)
        assert worker.returncode == 0, output[-3000:]

    runs = server.get("/api/v1/runs?project=multi")["runs"]
    assert len(runs) == 2
    assert {run["worker"] for run in runs} == {"worker:0", "worker:1"}
    job_id = runs[0]["job_id"]
    assert job_id and runs[1]["job_id"] == job_id
    assert {run["id"] for run in server.get(f"/api/v1/runs?job={job_id}")["runs"]} == {
        run["id"] for run in runs
    }
    run = server.get(f"/api/v1/runs/{runs[0]['id']}")
    assert [member["worker"] for member in run["job"]["runs"]] == ["worker:0", "worker:1"]
    for member in runs:
        assert member["status"] == "finished" and member["last_step"] == 20
        series = run_series(server, member["id"], "loss", "grad/global_norm")
        assert series["loss"]["step"] == list(range(1, 21))
        assert all(norm > 0 for norm in series["grad/global_norm"]["value"])
