"""A server whose database goes away: agents are told to come back, nothing is lost or
doubled, ``/healthz`` says so meanwhile, and SIGTERM still ends it. The fast sample of
``benchmarks/faults.py`` (which stops PostgreSQL for 1, 6 and 30 s, fills a disk, ...)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from harness.metrics import parse, scrape, value
from harness.polling import wait_for
from harness.processes import ServerProcess, run_series
from harness.services import PrivatePostgres, private_postgres
from trainvitals import Run, resolve

#: Seconds the database stays down: past the writer's patience (0.5 s here), so agents are
#: closed with 1013 and come back, as in a real outage, yet the test stays short.
OUTAGE = 2.0


@pytest.fixture
def pg() -> Iterator[PrivatePostgres]:
    with private_postgres() as started:
        yield started


def healthz(server: ServerProcess) -> int:
    status, _ = server.get_status("/healthz")
    return status


def test_a_database_outage_while_an_agent_streams_loses_and_doubles_nothing(
    pg: PrivatePostgres,
) -> None:
    server = ServerProcess(pg.url, extra_env={"TRAINVITALS_STORAGE_PATIENCE": "0.5"})
    try:
        run = Run(resolve(server=server.url, project="faults"), system_metrics=False,
                  watchdog=False)  # fmt: skip
        run.start()
        seen: list[int] = []
        polling = threading.Event()

        def poll() -> None:  # what a load balancer's probe sees all along
            while not polling.is_set():
                seen.append(healthz(server))
                polling.wait(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        step = 0

        def log_until(done: float) -> None:
            nonlocal step
            while time.monotonic() < done:  # a training loop's pace: a step each 5 ms
                step += 1
                run.log(step, {"loss": 1.0 / step})
                time.sleep(0.005)

        log_until(time.monotonic() + 0.5)
        stopped = time.monotonic()
        pg.stop()
        log_until(stopped + OUTAGE)
        wait_for(lambda: healthz(server) == 503, timeout=10, what="/healthz 503 while down")
        pg.start()
        restarted = time.monotonic()
        log_until(restarted + 0.5)
        wait_for(lambda: healthz(server) == 200, timeout=20, what="/healthz 200 once back")
        assert run.finish(timeout=30), "the agent's frames were not all acknowledged"
        polling.set()
        poller.join()
        assert 503 in seen and seen[-1] == 200

        stored = run_series(server, run.id, "loss")["loss"]["step"]
        assert stored == list(range(1, step + 1)), "a step lost or stored twice"
        assert server.get(f"/api/v1/runs/{run.id}")["status"] == "finished"
        status, text = scrape(server, None)
        metrics = parse(text)
        errors = value(metrics, "trainvitals_storage_errors_total", error="OperationalError")
        assert status == 200 and errors and errors > 0
        assert value(metrics, "trainvitals_writer_state") == 0
    finally:
        server.stop()
    output = server.output()
    assert "Traceback" not in output and "Exception in thread" not in output, output[-3000:]


def test_sigterm_ends_a_server_whose_database_is_down(pg: PrivatePostgres) -> None:
    server = ServerProcess(pg.url, extra_env={"TRAINVITALS_SHUTDOWN_GRACE": "2"})
    run = Run(resolve(server=server.url, project="faults"), system_metrics=False,
              watchdog=False)  # fmt: skip
    try:
        run.start()
        run.log(1, {"loss": 1.0})
        wait_for(lambda: server.get("/api/v1/runs")["runs"], what="the run stored")
        pg.stop()
        for step in range(2, 50):  # writes waiting on the database as the signal comes
            run.log(step, {"loss": 1.0})
        wait_for(lambda: healthz(server) == 503, timeout=10, what="/healthz 503 while down")
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=15)
        assert time.monotonic() - started < 10
    finally:
        run.finish(timeout=0)
        server.stop()
