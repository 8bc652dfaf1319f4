"""How runs end, with real processes: heartbeats, lost runs, signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.polling import wait_for
from harness.processes import (
    ServerProcess,
    demo_training,
    memory_cgroup,
    run_in_cgroup,
    run_series,
    start_script,
)
from trainvitals import Run, resolve
from trainvitals.server.live import Hub
from trainvitals.server.liveness import Liveness
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer

LOST_AFTER = 1.5

IDLE_AGENT = textwrap.dedent(
    """
    import sys, threading, trainvitals
    # No watchdog: this agent stands for a host that dies whole, or a network that is cut.
    mon = trainvitals.Monitor(server=sys.argv[1], run_name="idle", system_metrics=False,
                              watchdog=False)
    mon.log(1, metrics={"loss": 1.0})
    print("logged", flush=True)
    threading.Event().wait()  # alive, but no step ever completes again
    """
)


@pytest.fixture
def quick_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        str(tmp_path / "tv.db"), extra_env={"TRAINVITALS_LOST_AFTER": str(LOST_AFTER)}
    )
    yield server
    server.stop()


def only_run(server: ServerProcess) -> dict[str, Any]:
    runs = wait_for(lambda: server.get("/api/v1/runs")["runs"], what="the run")
    run: dict[str, Any] = server.get(f"/api/v1/runs/{runs[0]['id']}")
    return run


def crashed_run(server: ServerProcess, timeout: float) -> dict[str, Any]:
    """The run, once the watchdog has reported it crashed."""
    run: dict[str, Any] = wait_for(
        lambda: (run := only_run(server))["status"] == "crashed" and run,
        timeout=timeout,
        what="the watchdog's report",
    )
    return run


def test_heartbeats_keep_an_idle_run_alive_and_a_killed_one_is_lost(
    quick_server: ServerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "idle.py"
    script.write_text(IDLE_AGENT)
    agent = subprocess.Popen(
        [sys.executable, str(script), quick_server.url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TRAINVITALS_HEARTBEAT_INTERVAL": "0.2"},
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "logged"
        started = only_run(quick_server)["last_seen"]

        def alive_long_after() -> bool:
            run = only_run(quick_server)
            assert run["status"] == "running", run  # heartbeats, no steps: still running
            return bool(run["last_seen"] > started + 3 * LOST_AFTER)

        wait_for(alive_long_after, timeout=20, what="heartbeats across 3 lost_after windows")
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        killed_at = time.time()
        lost = wait_for(
            lambda: (run := only_run(quick_server))["status"] == "lost" and run,
            timeout=15,
            what="the run to be lost",
        )
        assert lost["end_reason"] == "heartbeat_lost"
        assert lost["ended_at"] <= killed_at
    finally:
        agent.kill()
        agent.wait()


def test_sigterm_is_recorded_and_still_ends_the_process(server: ServerProcess) -> None:
    training = demo_training(server, "terminated")
    try:
        wait_for(
            lambda: (only_run(server)["last_step"] or 0) >= 5,
            timeout=120,
            what="training to be under way",
        )
        training.send_signal(signal.SIGTERM)
        assert training.wait(30) == -signal.SIGTERM  # the process's normal behaviour is kept
    finally:
        training.kill()
        training.wait()
    run = only_run(server)
    assert (run["status"], run["end_reason"]) == ("crashed", "signal:SIGTERM")


def test_sigkill_is_reported_by_the_watchdog_within_seconds(server: ServerProcess) -> None:
    training = demo_training(server, "killed")
    try:
        wait_for(
            lambda: (only_run(server)["last_step"] or 0) >= 5,
            timeout=120,
            what="training to be under way",
        )
        training.send_signal(signal.SIGKILL)
        training.wait(10)
        crashed = crashed_run(server, timeout=5)
        assert crashed["end_reason"] == "signal:SIGKILL"
    finally:
        training.kill()
        training.wait()


FORKING = textwrap.dedent(
    """
    import os, sys, threading, trainvitals
    mon = trainvitals.Monitor(server=sys.argv[1], run_name="forking", system_metrics=False)
    mon.log(1, metrics={"loss": 1.0})
    sys.stdin.readline()  # the test saw step 1 stored: the run's connection is open
    if os.fork() == 0:  # a data loader's worker, which outlives the training process
        sys.stdin.read()  # until the test closes the pipe
        os._exit(0)
    print("forked", flush=True)
    threading.Event().wait()
    """
)


def told_to_go_on(server: ServerProcess, script: Path, text: str) -> subprocess.Popen[str]:
    """The training script ``text``, started against ``server``, told to go on (a line on its
    stdin) once its step 1 is stored."""
    training = start_script(script, text, server.url)
    assert training.stdin is not None
    try:
        wait_for(lambda: only_run(server)["last_step"] == 1, timeout=60, what="step 1 stored")
        training.stdin.write("go\n")
        training.stdin.flush()
    except BaseException:
        training.kill()
        training.wait()
        raise
    return training


def test_a_killed_process_whose_forked_worker_lives_on_is_reported_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The worker's copy of the run's socket is closed when it is forked: the server sees
    the connection end with the training process, and the watchdog's report, which waits
    for that (up to 15 s), comes at once."""
    training = told_to_go_on(server, tmp_path / "forking.py", FORKING)
    assert training.stdin is not None and training.stdout is not None
    try:
        assert training.stdout.readline().strip() == "forked"
        training.send_signal(signal.SIGKILL)
        training.wait(10)
        crashed = crashed_run(server, timeout=10)
        assert crashed["end_reason"] == "signal:SIGKILL"
    finally:
        training.kill()
        training.wait()
        training.stdin.close()  # the worker reads to the end of its input and exits


WORKERS = textwrap.dedent(
    """
    import ctypes, multiprocessing, os, resource, sys, threading, trainvitals

    def waits():
        threading.Event().wait()

    def crashes():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        ctypes.string_at(0)  # a C extension's bad pointer: SIGSEGV

    mon = trainvitals.Monitor(server=sys.argv[1], run_name="workers", system_metrics=False)
    mon.log(1, metrics={"loss": 1.0})
    sys.stdin.readline()  # the test saw step 1 stored
    fork = multiprocessing.get_context("fork")
    stopped = fork.Process(target=waits)
    stopped.start()
    stopped.terminate()  # SIGTERM at once, as a pool shutting down sends its workers
    stopped.join(30)
    if stopped.is_alive():  # the SIGTERM was lost
        stopped.kill()
    crashed = fork.Process(target=crashes)
    crashed.start()
    crashed.join(30)
    child = os.fork()
    if child == 0:  # a plain fork's child: a finish is not its to do, then it exits as a
        sys.exit(3 if mon.finish() is False else 4)  # script does (atexit handlers run)
    exited = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    mon.log(2, metrics={"loss": 0.5})
    print(stopped.exitcode, crashed.exitcode, exited, flush=True)
    threading.Event().wait()
    """
)


def test_workers_forked_from_the_training_process_end_without_ending_its_run(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A forked worker holds a copy of the run, not its threads. Terminated at once, it dies
    (CPython dropped the SIGTERM that reached it before its fork was complete, and join()
    waited forever); terminated or exiting, it does not tell the watchdog the run ended (the
    watchdog left, and the training process's SIGKILL went unreported); crashing, its dump
    does not land in the file the watchdog reads (the SIGKILL was reported as the worker's
    segfault)."""
    training = told_to_go_on(server, tmp_path / "workers.py", WORKERS)
    assert training.stdout is not None
    try:
        assert training.stdout.readline().split() == [
            str(-signal.SIGTERM), str(-signal.SIGSEGV), "3"
        ]  # fmt: skip
        wait_for(lambda: only_run(server)["last_step"] == 2, timeout=30, what="step 2 stored")
        assert only_run(server)["status"] == "running"
        training.send_signal(signal.SIGKILL)
        training.wait(10)
        crashed = crashed_run(server, timeout=15)
        assert crashed["end_reason"] == "signal:SIGKILL", crashed["traceback"]
    finally:
        training.kill()
        training.wait()


GREEDY = textwrap.dedent(
    """
    import sys, time, trainvitals
    mon = trainvitals.Monitor(server=sys.argv[1], run_name="greedy", system_metrics=0.05)
    hoard = []
    for step in range(1, 100_000):
        hoard.append(bytearray(16 * 2**20))  # 16 MiB a step, touched: a leak that never ends
        time.sleep(0.05)  # a training step's worth of time, so the sampler sees the climb
        mon.log(step, metrics={"loss": 1.0 / step})
        if step == 5:
            print("leaking", flush=True)
    """
)


def test_a_real_oom_kill_in_a_memory_cgroup_is_reported(
    server: ServerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    with memory_cgroup(400 * 2**20) as group:
        result = run_in_cgroup(group, sys.executable, str(script), server.url)
        assert result.returncode == -signal.SIGKILL, result.stderr  # the kernel killed it
        assert "leaking" in result.stdout
        run = crashed_run(server, timeout=15)
    assert run["end_reason"] == "oom_killed"
    rss = run_series(server, run["id"], "host/rss", "host/limit")
    assert rss["host/limit"]["value"][-1] == 400 * 2**20
    assert max(rss["host/rss"]["value"]) > 300 * 2**20  # the evidence: memory near the limit


FOLDS = textwrap.dedent(
    """
    import sys, trainvitals
    kept = []
    for fold in range(100):
        with trainvitals.Monitor(server=sys.argv[1], run_name=f"fold-{fold}",
                                 system_metrics=0.05) as mon:
            if fold == 3:  # the fit that no longer fits: killed while its watchdog starts
                print("leaking", flush=True)
                while True:
                    kept.append(bytearray(16 * 2**20))
            mon.log(1, metrics={"loss": 1.0})
        kept.append(bytearray(48 * 2**20))  # what each fold keeps: the loop's leak
    """
)


def test_an_oom_kill_in_a_later_fit_of_a_loop_is_an_oom_kill(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The kernel kills the fourth run of a process at its start, before its watchdog, itself
    starting under the same limit, could have read the OOM-kill counter: the counter read by
    the training process before the watchdog starts is the baseline."""
    script = tmp_path / "folds.py"
    script.write_text(FOLDS)
    with memory_cgroup(400 * 2**20) as group:
        result = run_in_cgroup(group, sys.executable, str(script), server.url)
        assert result.returncode == -signal.SIGKILL, result.stderr
        assert "leaking" in result.stdout
        run = crashed_run(server, timeout=15)
    assert run["name"] == "fold-3"
    assert run["end_reason"] == "oom_killed"


SEGFAULT = textwrap.dedent(
    """
    import ctypes, sys, trainvitals
    mon = trainvitals.Monitor(server=sys.argv[1], run_name="segv", system_metrics=False)
    mon.log(1, metrics={"loss": 1.0})
    print("crashing", flush=True)
    ctypes.string_at(0)
    """
)


def test_a_segfault_is_reported_with_the_faulthandler_dump(
    server: ServerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "segv.py"
    script.write_text(SEGFAULT)
    result = subprocess.run(
        [sys.executable, str(script), server.url], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -signal.SIGSEGV
    assert "Warning" not in result.stderr  # starting the watchdog adds nothing to the output
    run = crashed_run(server, timeout=15)
    assert run["end_reason"] == "signal:SIGSEGV"
    assert "Segmentation fault" in run["traceback"] and "segv.py" in run["traceback"]


def test_liveness_is_rebuilt_from_storage(tmp_path: Path) -> None:
    """After a restart, runs stored as running are judged by their stored last_seen."""
    store = Store(str(tmp_path / "tv.db"))
    store.create_schema()
    hello = {
        "run_id": "r1",
        "project": "p",
        "name": "n",
        "config": {},
        "host": "h",
        "pid": 1,
        "started_at": 100.0,
        "env": {},
    }

    secrets: list[str | None] = []

    async def scenario() -> tuple[list[str], list[str]]:
        writer = Writer(store)
        try:
            made = await writer.submit(lambda conn: store.runs.open_run(conn, hello, now=100.0))
            secrets.append(made["secret"])
            liveness = Liveness(store.runs, writer, Hub(), lost_after=30.0)
            await liveness.start()
            await liveness.stop()
            early = await liveness.check(now=120.0)
            late = await liveness.check(now=131.0)
            return early, late
        finally:
            writer.close()

    early, late = asyncio.run(scenario())
    assert (early, late) == ([], ["r1"])
    run = store.runs.get_run("r1")
    assert run is not None and (run["status"], run["end_reason"], run["ended_at"]) == (
        "lost",
        "heartbeat_lost",
        100.0,
    )
    with store.transaction() as work:  # the agent reconnects: alive after all
        again = {**hello, "run_secret": secrets[0]}
        assert store.runs.open_run(work, again, now=140.0)["status"] == "running"
    assert store.runs.get_run("r1")["end_reason"] is None  # type: ignore[index]
    store.dispose()


HANGING = textwrap.dedent(
    """
    import os, sys, time, numpy as np, keras, trainvitals

    def batches():
        rng = np.random.default_rng(0)
        for i in range(10**6):
            if i == 30:
                print("hanging", flush=True)
                while not os.path.exists(sys.argv[2]):  # the input pipeline hangs
                    time.sleep(0.05)
            if i > 30:
                time.sleep(0.1)  # then slow steps: running, long enough to be seen so
            yield rng.normal(size=(16, 4)).astype("float32"), np.ones((16, 1), "float32")

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    vitals = trainvitals.VitalsCallback(server=sys.argv[1], run_name="hang")
    model.fit(batches(), steps_per_epoch=60, epochs=1, verbose=0, callbacks=[vitals])
    """
)


def test_a_hung_run_stays_stalled_while_samples_arrive_and_runs_again_on_a_new_step(
    db_url: str, tmp_path: Path
) -> None:
    """The once-a-second host samples carry the step the run hangs at: no progress, so the
    run stays ``stalled`` while they arrive, and is ``running`` only once a newer step comes
    (on SQLite and PostgreSQL, whose guarded updates differ)."""
    server = ServerProcess(db_url)
    script, release = tmp_path / "hang.py", tmp_path / "release"
    script.write_text(HANGING)
    training = subprocess.Popen(
        [sys.executable, str(script), server.url, str(release)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TRAINVITALS_STALL_FLOOR": "2"},
    )
    try:
        assert training.stdout is not None and training.stdout.readline().strip() == "hanging"
        # On a loaded host a slow step before the hang may be reported as a stall too (the
        # floor is 2 s here); that one ends with the next step. Wait for the hang's report.
        stalled = wait_for(
            lambda: (
                (run := only_run(server))["status"] == "stalled"
                and "in batches" in (run["stall_stacks"] or "")
                and run
            ),
            timeout=15,
            what="the run to be stalled where its input hangs",
        )
        report = stalled["stall_stacks"]
        assert report.startswith("No training step for")
        # Where it hangs: the wait loop, caught on either of its two lines.
        assert "time.sleep(0.05)" in report or "os.path.exists(sys.argv[2])" in report, report

        def samples() -> int:
            series = run_series(server, stalled["id"], "host/rss")
            return len(series.get("host/rss", {}).get("step", []))

        seen = samples()
        wait_for(lambda: samples() >= seen + 3, timeout=10, what="three more host samples")
        run = only_run(server)
        assert (run["status"], run["last_step"]) == ("stalled", stalled["last_step"])
        rss = run_series(server, stalled["id"], "host/rss")["host/rss"]["step"]
        assert rss[-1] == stalled["last_step"]  # the samples are filed under the hung step

        release.touch()  # the generator wakes up: a newer step ends the stall
        resumed = wait_for(
            lambda: (r := only_run(server))["status"] == "running" and r,
            timeout=15,
            what="the run to be running again",
        )
        assert resumed["last_step"] > stalled["last_step"]
        assert training.wait(120) == 0
        ended = wait_for(lambda: (r := only_run(server))["status"] == "finished" and r)
        assert ended["last_step"] == 60
    finally:
        training.kill()
        training.wait()
        server.stop()


def test_a_run_given_up_as_lost_comes_back_when_its_points_arrive(
    quick_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Silent longer than lost_after (no heartbeat meanwhile), yet connected all along: what a
    # network hiccup or a paused server looks like from the other side.
    monkeypatch.setenv("TRAINVITALS_HEARTBEAT_INTERVAL", "3600")
    run = Run(resolve(server=quick_server.url, project="p"), system_metrics=False,
              watchdog=False)  # fmt: skip
    run.start()
    run.log(1, {"loss": 1.0})
    wait_for(lambda: only_run(quick_server)["status"] == "lost", timeout=15, what="lost")
    crash = wait_for(
        lambda: [a for a in quick_server.get(f"/api/v1/runs/{run.id}/alerts")["alerts"]
                 if a["rule"] == "crash"],
        what="the crash alert for the silence",
    )  # fmt: skip
    assert crash[0]["state"] == "firing"
    run.log(2, {"loss": 0.9})
    back = wait_for(
        lambda: (r := only_run(quick_server))["status"] == "running" and r, what="running again"
    )
    assert back["end_reason"] is None and back["ended_at"] is None
    # The run's status and its alert's resolution are two writes: wait for the second.
    wait_for(
        lambda: [a["state"] for a in quick_server.get(f"/api/v1/runs/{run.id}/alerts")["alerts"]
                 if a["rule"] == "crash"] == ["resolved"],
        what="the crash alert resolved",
    )  # fmt: skip
    assert run.finish()
    assert only_run(quick_server)["status"] == "finished"
