"""The watchdog process: it speaks for a training process that could not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import psutil

from harness.polling import wait_for
from tests.agent.peer import running_peer
from tests.agent.test_transport import hello
from trainvitals.protocol import END, HELLO, EndReason

TRAINING = textwrap.dedent(
    """
    import faulthandler, json, os, signal, sys
    from trainvitals.agent.watchdog import Watchdog

    url, hello, ending = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    if ending == "clean":
        faulthandler.enable()  # the user's own: the watchdog then keeps no fault file
    watchdog = Watchdog(url, hello, token="t0ken")
    if ending == "clean":
        watchdog.done()
    else:
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _watchdogs(pid: int) -> list[psutil.Process]:
    """The watchdog processes watching ``pid``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "--pid" in cmdline and str(pid) in cmdline and "--url" in cmdline:
            found.append(process)
    return found


def _train(url: str, ending: str) -> int:
    """Run a training process that ends ``ending``; return once its watchdog is gone too."""
    process = subprocess.Popen([sys.executable, "-c", TRAINING, url, json.dumps(hello()), ending])
    code = process.wait(60)
    wait_for(lambda: not _watchdogs(process.pid), timeout=90, what="the watchdog to exit")
    return code


def test_a_killed_process_is_reported_as_the_run_numbered_after_what_was_stored() -> None:
    with running_peer() as peer:
        peer.last_seq = 41  # the run had sent 41 frames before it died
        assert _train(peer.url, "kill") == -9
        frames = peer.frames()
    assert [f["type"] for f in frames] == [HELLO, END]
    assert frames[0]["run_id"] == "r1"
    assert frames[0]["run_secret"] == hello()["run_secret"]  # it speaks as the run's owner
    assert frames[0]["watchdog"] is True  # the server reads the dead process's frames first
    assert (frames[1]["seq"], frames[1]["reason"]) == (42, EndReason.SIGKILL)
    assert peer.authorizations == ["Bearer t0ken"]  # the token came through the environment


def test_a_clean_ending_says_nothing_even_when_the_process_is_gone_at_once() -> None:
    with running_peer() as peer:
        assert _train(peer.url, "clean") == 0
    assert peer.frames() == []
