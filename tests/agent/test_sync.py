"""Nothing lost at the end: frames a run could not deliver before its process ended reach a
real server later, through ``trainvitals sync`` or the next run started on the machine."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.polling import wait_for
from harness.processes import ServerProcess, free_port, run_series, start_script
from trainvitals import Run, resolve
from trainvitals.agent.spool_format import HEAD_SEGMENT, META_FILE
from trainvitals.agent.sync import find_spools, load
from trainvitals.exceptions import SpoolError


def sync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainvitals", "sync", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def steps_of(server: ServerProcess, run_id: str) -> list[int]:
    return list(run_series(server, run_id, "loss")["loss"]["step"])


def ending(server: ServerProcess, run_id: str) -> tuple[str, str | None]:
    run = server.get(f"/api/v1/runs/{run_id}")
    return run["status"], run["end_reason"]


def crash_alerts(server: ServerProcess, run_id: str) -> list[str]:
    alerts = server.get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
    return [alert["state"] for alert in alerts if alert["rule"] == "crash"]


def test_a_fit_sent_to_a_wrong_port_reaches_the_server_whole_with_trainvitals_sync(
    server: ServerProcess,
    own_spool_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("keras")
    import trainvitals
    from tests.agent.test_keras_callback import BATCH, regression_data, small_model

    wrong = f"http://127.0.0.1:{free_port()}"
    vitals = trainvitals.VitalsCallback(
        server=wrong, project="tests", run_name="wrong-port", system_metrics=False,
        watchdog=False,
    )  # fmt: skip
    x, y = regression_data()
    with caplog.at_level(logging.WARNING, logger="trainvitals"):
        small_model(0.01).fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[vitals])
    assert vitals.run is not None
    run_id = vitals.run.id
    spool = own_spool_dir / run_id
    [line] = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert "run 'wrong-port' ended with" in line and "up to step 12 and its end" in line
    assert f"the server at {wrong} could not be reached (ConnectionRefusedError" in line
    assert f"Spooled to {spool}: `trainvitals sync`" in line and "--server URL" in line
    assert "$TRAINVITALS_SERVER" in line
    assert (spool / META_FILE).exists() and (spool / HEAD_SEGMENT).exists()
    listed = sync("--dry-run")
    assert listed.returncode == 0 and f"{spool}: run 'wrong-port'" in listed.stdout
    copy = tmp_path / "copy"
    shutil.copytree(spool, copy / run_id)

    sent = sync("--server", server.url)
    assert sent.returncode == 0, sent.stderr
    delivered = re.search(rf"delivered (\d+) frames \(up to seq \1\) to {server.url}; "
                          "it ended completed", sent.stdout)  # fmt: skip
    assert delivered, sent.stdout
    assert steps_of(server, run_id) == list(range(1, 13))  # both epochs, every step
    assert ending(server, run_id) == ("finished", "completed")
    assert not spool.exists()  # acknowledged: gone

    again = sync("--server", server.url, str(copy))  # the same frames a second time
    assert again.returncode == 0, again.stderr
    assert f"nothing left to deliver to {server.url}; {delivered[1]} it had already" in again.stdout
    assert steps_of(server, run_id) == list(range(1, 13))  # nothing doubled


FIRST_RUN = textwrap.dedent(
    """
    import sys
    import trainvitals

    run = trainvitals.Run(trainvitals.resolve(server=sys.argv[1], run_name="first"),
                          system_metrics=False, watchdog=False)
    run.start()
    for step in range(1, 51):
        run.log(step, {"loss": 1.0 / step})
    print(run.id, flush=True)
    sys.stdin.readline()  # the server is gone
    for step in range(51, 101):
        run.log(step, {"loss": 1.0 / step})
    print("finished:", run.finish(), flush=True)
    """
)


def test_a_run_whose_server_died_before_its_end_is_delivered_by_the_next_run_started(
    tmp_path: Path, own_spool_dir: Path
) -> None:
    port, db = free_port(), str(tmp_path / "tv.db")
    quick = {"TRAINVITALS_LOST_AFTER": "1.5"}
    server = ServerProcess(db, port=port, extra_env=quick)
    first = start_script(tmp_path / "first.py", FIRST_RUN, server.url)
    try:
        assert first.stdout is not None and first.stdin is not None
        run_id = first.stdout.readline().strip()
        wait_for(lambda: len(steps_of(server, run_id)) == 50, what="the first half")
        server.stop()
        first.stdin.write("go\n")
        first.stdin.flush()
        assert first.stdout.readline() == "finished: False\n"
        assert first.wait(30) == 0
        assert (own_spool_dir / run_id / META_FILE).exists()

        server = ServerProcess(db, port=port, extra_env=quick)
        wait_for(lambda: ending(server, run_id) == ("lost", "heartbeat_lost"),
                 what="the silent run given up as lost")  # fmt: skip
        wait_for(lambda: crash_alerts(server, run_id) == ["firing"], what="its crash alert")
        later = Run(resolve(server=server.url, run_name="later"), system_metrics=False,
                    watchdog=False)  # fmt: skip
        later.start()  # ... and delivers what the first process left
        wait_for(lambda: ending(server, run_id) == ("finished", "completed"), timeout=30,
                 what="the late end to win over the lost verdict")  # fmt: skip
        assert steps_of(server, run_id) == list(range(1, 101))  # every step, once
        wait_for(lambda: crash_alerts(server, run_id) == ["resolved"], what="no crash after all")
        assert later.finish()
        assert list(own_spool_dir.iterdir()) == []
    finally:
        if first.poll() is None:
            first.kill()
        server.stop()


def test_a_damaged_spool_delivers_what_it_can_and_says_what_was_lost(
    server: ServerProcess, own_spool_dir: Path
) -> None:
    wrong = f"http://127.0.0.1:{free_port()}"
    runs = []
    for name in ("damaged", "whole", "no-meta"):
        run = Run(resolve(server=wrong, run_name=name), system_metrics=False, watchdog=False)
        run.start()
        for step in range(1, 21):
            run.log(step, {"loss": 1.0 / step})
        assert not run.finish(timeout=0.5)
        runs.append(run)
    damaged, whole, no_meta = (own_spool_dir / run.id for run in runs)
    head = damaged / HEAD_SEGMENT
    shutil.copy(head, head.with_name("000001.seg"))  # a second segment: read all the same
    size = head.stat().st_size
    with head.open("r+b") as file:
        file.truncate(size - 5)  # the end frame, cut short
    (no_meta / META_FILE).write_text('{"version": 1, "serv')

    result = sync("--server", server.url)
    assert result.returncode == 1
    assert f"{no_meta / META_FILE}: cannot be read as JSON" in result.stderr
    assert f"lost: {head}: the record at byte" in result.stderr and "cut short" in result.stderr
    assert steps_of(server, runs[1].id) == list(range(1, 21))
    assert ending(server, runs[1].id) == ("finished", "completed")  # the others: untouched
    assert steps_of(server, runs[0].id) == list(range(1, 21))
    assert ending(server, runs[0].id) == ("finished", "completed")  # from the second segment
    assert not damaged.exists() and not whole.exists()
    assert no_meta.exists()  # nothing deleted that was not delivered


def test_a_run_json_that_cannot_be_used_is_named_without_its_secret(tmp_path: Path) -> None:
    spool = tmp_path / "run1"
    spool.mkdir()
    (spool / "lock").touch()
    hello = {"type": "hello", "run_id": "run1", "project": "p", "run_secret": "s3cret"}
    (spool / META_FILE).write_text(json.dumps({"version": 1, "server": "http://x", "hello": hello}))
    with pytest.raises(SpoolError) as error:
        load(spool)
    assert str(error.value).startswith(f"{spool / META_FILE}: expected a 'server' URL and a")
    assert "s3cret" not in str(error.value)
    assert find_spools([tmp_path]) == [spool]


def test_a_spool_others_could_write_is_never_delivered(tmp_path: Path) -> None:
    """A directory made ahead of us in a shared temporary directory would otherwise send
    another user's frames under our token."""
    spool = tmp_path / "run1"
    spool.mkdir(mode=0o700)
    (spool / "lock").touch()
    hello = {"type": "hello", "run_id": "run1", "project": "p", "name": "n"}
    (spool / META_FILE).write_text(json.dumps({"version": 1, "server": "http://x", "hello": hello}))
    (spool / META_FILE).chmod(0o600)
    assert load(spool).run_id == "run1"
    spool.chmod(0o777)
    with pytest.raises(SpoolError, match="writable by others; delete it unless"):
        load(spool)
