"""The watchdog: says how a training process ended when the process itself could not.

SIGKILL, the kernel's OOM killer and a segfault leave no chance to speak from inside. So
:class:`Watchdog` starts :func:`main` in a small Python process, in a session of
its own, that holds a pipe from the training process and watches its pid. A clean ending says
``done`` down the pipe. If instead the process disappears, the watchdog tells the server,
speaking as the run: ``hello``, then an ``end`` numbered after the last frame the server
stored. The reason is ``oom_killed`` when the memory cgroup's OOM-kill counter rose from what
the training process read just before starting the watchdog,
``signal:SIGSEGV`` (with the dump) when ``faulthandler`` wrote one, else ``signal:SIGKILL``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import IO

from trainvitals.agent.host import cgroup_oom_kills
from trainvitals.backoff import backoff_delays
from trainvitals.protocol import EndReason, HelloFrame, end_frame

#: How long the watchdog keeps trying to reach the server with the news.
REPORT_FOR = 60.0

#: How long the watchdog waits for the server's welcome (the server first reads the dead
#: process's connection to its end: ``trainvitals.server.ingest.DRAIN_FOR``, 15 s at most).
WELCOME_WITHIN = 30.0

_ENTRY = "import sys; from trainvitals.agent.watchdog import main; sys.exit(main(sys.argv[1:]))"

#: This process's watchdogs, for :func:`_leave_the_fault_file_to_the_parent`.
_watchdogs: weakref.WeakSet[Watchdog] = weakref.WeakSet()


def _leave_the_fault_file_to_the_parent() -> None:
    """In a child forked from the training process (a data loader's worker): stop writing
    crash dumps to the file the parent's watchdog reads. A segfault of the child would
    otherwise leave its stack there, and the parent's own death later, a SIGKILL, would be
    reported as that segfault. faulthandler goes back to what it was before the watchdog (off);
    the parent's file is untouched."""
    for watchdog in list(_watchdogs):
        if watchdog._fault_file is not None:
            faulthandler.disable()
            watchdog._fault_file.close()  # the child's copy of the descriptor only
            watchdog._fault_file = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_leave_the_fault_file_to_the_parent)


class Watchdog:
    """The training side: starts the watchdog process; :meth:`done` on a clean ending.

    Args:
        url: the server's ingest websocket URL.
        hello: the run's ``hello`` frame (the watchdog speaks as the run).
        token: the bearer token, passed through the environment, never the command line.
    """

    def __init__(self, url: str, hello: HelloFrame, token: str | None) -> None:
        self._fault_file: IO[str] | None = None
        self._faults_lock = threading.Lock()  # the run's finishing thread, or its sender's
        self._fault_path = ""
        if not faulthandler.is_enabled():  # leave a user's own faulthandler set-up alone
            handle, self._fault_path = tempfile.mkstemp(prefix="trainvitals-fault-", suffix=".txt")
            self._fault_file = os.fdopen(handle, "w")
            faulthandler.enable(self._fault_file, all_threads=True)
        env = {**os.environ, "TRAINVITALS_TOKEN": token or ""}
        # Counted here, not by the watchdog once it runs: near the limit (the last fit of a
        # leaking loop) its own start-up can take the kill's place in the count it reads first.
        oom_kills = cgroup_oom_kills()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                # Not `-m trainvitals.agent.watchdog`: the package imports this module, and runpy
                # would warn about running it again as __main__ in every training's stderr.
                _ENTRY,
                "--url",
                url,
                "--pid",
                str(os.getpid()),
                "--fault-file",
                self._fault_path,
                *(["--oom-kills", str(oom_kills)] if oom_kills is not None else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,  # a Ctrl-C or kill of the job's process group spares it
        )
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(hello) + "\n")
        self._process.stdin.flush()
        _watchdogs.add(self)

    def done(self) -> None:
        """The run ended and told the server itself: the watchdog can go."""
        try:
            assert self._process.stdin is not None
            self._process.stdin.write("done\n")
            self._process.stdin.close()
        except (OSError, ValueError):
            pass
        self.release_faults()

    def release_faults(self) -> None:
        """Stop sending crash dumps to this watchdog's file (the run has ended, though its
        watchdog may wait for the server to have the end): the next run's watchdog, started
        meanwhile, must not find ``faulthandler`` taken, nor a crash of its fit be filed here."""
        with self._faults_lock:
            fault_file, self._fault_file = self._fault_file, None
        if fault_file is not None:
            faulthandler.disable()
            fault_file.close()
            Path(self._fault_path).unlink(missing_ok=True)


# -- the watchdog process ---------------------------------------------------------------------


def _wait_for_ending(pid: int) -> bool:
    """True when the parent said ``done``; False when it vanished without a word."""
    import psutil

    def alive() -> bool:
        try:
            parent = psutil.Process(pid)
            return bool(parent.is_running() and parent.status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False

    stdin_open = True
    while True:
        if stdin_open:
            readable, _, _ = select.select([sys.stdin], [], [], 0.25)
            if readable:
                line = sys.stdin.readline()
                if line.strip() == "done":
                    return True
                if line == "":  # EOF; forked children may still hold the pipe: watch the pid
                    stdin_open = False
        else:
            time.sleep(0.25)
        if not alive():
            # A short run may say "done" and exit before this process even looked: read
            # what it left in the pipe before calling it killed.
            while stdin_open and select.select([sys.stdin], [], [], 0)[0]:
                line = sys.stdin.readline()
                if line.strip() == "done":
                    return True
                stdin_open = line != ""
            return False


def _report(url: str, hello: HelloFrame, reason: str, traceback_text: str | None) -> None:
    from websockets.sync.client import connect

    token = os.environ.get("TRAINVITALS_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + REPORT_FOR
    delays = backoff_delays(initial=0.2, maximum=5.0)
    while True:
        try:
            with connect(url, additional_headers=headers, open_timeout=5) as ws:
                ws.send(json.dumps({**hello, "watchdog": True}))
                # The server answers once it has read what the process sent before it died.
                welcome = json.loads(ws.recv(timeout=WELCOME_WITHIN))
                seq = int(welcome["last_seq"]) + 1
                ws.send(json.dumps(end_frame(seq, reason, time.time(), traceback_text)))
                ws.recv(timeout=10)  # the ack
                return
        except Exception:
            if time.monotonic() > deadline:
                return
            time.sleep(next(delays))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainvitals-watchdog")
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--fault-file", default="")
    parser.add_argument("--oom-kills", type=int, default=None)
    args = parser.parse_args(argv)
    hello = json.loads(sys.stdin.readline())
    oom_before = args.oom_kills if args.oom_kills is not None else (cgroup_oom_kills() or 0)
    if _wait_for_ending(args.pid):
        return 0
    fault_file = Path(args.fault_file) if args.fault_file else None
    fault = fault_file.read_text() if fault_file is not None and fault_file.exists() else ""
    if fault_file is not None:
        fault_file.unlink(missing_ok=True)
    if (cgroup_oom_kills() or 0) > oom_before:
        reason, text = EndReason.OOM_KILLED.value, None
    elif "Segmentation fault" in fault:
        reason, text = EndReason.SIGSEGV.value, fault
    elif "Fatal Python error" in fault:
        reason, text = EndReason.FATAL_ERROR.value, fault
    else:
        reason, text = EndReason.SIGKILL.value, None
    _report(args.url, hello, reason, text)
    return 0
