"""Test helpers: a real server process, a throwaway PostgreSQL db."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.polling import wait_for

#: The fields every run has, by the contract in docs/contract.md.
RUN_CONTRACT_FIELDS = frozenset({
    "id", "project", "name", "status", "started_at", "ended_at", "last_step", "last_seen",
    "host", "end_reason",
})  # fmt: skip

POSTGRES_ADMIN_URL = os.environ.get(
    "TRAINVITALS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


class ServerProcess:
    """``trainvitals serve`` in a subprocess, on a free port."""

    def __init__(
        self,
        db: str,
        extra_env: dict[str, str] | None = None,
        python: str = sys.executable,
        port: int = 0,
        args: Sequence[str] = (),
        token: str | None = None,
    ) -> None:
        self.db = db
        #: Sent as ``Authorization: Bearer`` by :meth:`get` and :meth:`post`.
        self.token = token
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        self.process = subprocess.Popen(
            [python, "-m", "trainvitals", "serve", "--port", str(port), "--db", db, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.search(r"http://[\d.]+:(\d+)/", line)
        if not match:
            rest = self.process.stdout.read() if self.process.poll() is not None else ""
            self.process.kill()
            raise RuntimeError(f"server did not start: {line!r} {rest!r}")
        self.port = int(match.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        # Drain what the server prints: a full pipe would block its writes, and so its loop.
        self._output: deque[str] = deque([line], maxlen=20_000)
        self._drain = threading.Thread(target=self._read_output, daemon=True)
        self._drain.start()
        wait_for(lambda: self.get("/healthz")["status"] == "ok", what="server /healthz")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._output.append(line)

    def output(self) -> str:
        """What the server printed (its last 20,000 lines); complete once it has stopped."""
        return "".join(self._output)

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers=self._headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self.send("POST", path, body)

    def send(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """``method`` with ``body`` as JSON: the status and the answer (None when empty)."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else b"",
            headers={"Content-Type": "application/json", **self._headers()},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get_status(self, path: str) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stop(self) -> None:
        terminate(self.process)
        self._drain.join(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()


def start_script(script: Path, text: str, *args: str) -> subprocess.Popen[str]:
    """The Python script ``text``, written to ``script`` and started with ``args`` in its
    directory, its stdin and stdout piped (to tell it to go on, and to read what it says)."""
    script.write_text(text)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=script.parent,
    )


def terminate(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM ``process`` unless it ended; SIGKILL it when it outlives ``timeout``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running_server(db: str) -> Iterator[ServerProcess]:
    server = ServerProcess(db)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards; yields its URL."""
    import psycopg

    name = f"trainvitals_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({exc}); "
            "`make test` starts it (scripts/ensure-services.sh)"
        ) from exc
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_series(
    server: ServerProcess, run_id: str, *names: str, max_points: int = 100_000
) -> dict[str, Any]:
    query = "&".join(f"name={n}" for n in names)
    series: dict[str, Any] = server.get(
        f"/api/v1/runs/{run_id}/series?{query}&max_points={max_points}"
    )["series"]
    return series


ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def git_worktree(ref: str) -> Iterator[Path]:
    """This repository at git ``ref``, checked out (detached) in a temporary directory that
    goes when the block ends: the code a benchmark's ``--against REF`` measures against."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "ref"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(tree), ref], check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=False,
                           capture_output=True)  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) process ``pid``'s threads have used, to the nanosecond
    (each live thread's ``schedstat``; ``stat``'s clock ticks, 10 ms, are too coarse for a
    second of a quiet server), or 0 once it has ended. A thread that ended between two
    readings takes its time with it: the servers measured keep their threads."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # the thread ended while read
    except OSError:
        return 0.0
    return total / 1e9


def free_port() -> int:
    """A port nothing listens on now (for a server that must come back on the same port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1 or v2), or None when there is none."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


@contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A child memory cgroup with ``limit_bytes``; yields its directory (write a pid to
    ``cgroup.procs`` to move a process in). Needs root and a writable cgroup tree."""
    parent = own_memory_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        import pytest

        pytest.skip("no writable memory cgroup here (needs root)")
    group = parent / f"trainvitals-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        v2 = (group / "memory.max").exists()
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        yield group
    finally:

        def removed() -> bool:  # the processes in it must have exited before it can go
            try:
                group.rmdir()
            except OSError:
                return False
            return True

        with contextlib.suppress(AssertionError):  # left behind, as before, after 5 s
            wait_for(removed, timeout=5.0, what=f"{group} to be removable")


def demo_command(server: ServerProcess, name: str, *args: str) -> list[str]:
    """``trainvitals demo`` streaming to ``server`` as run ``name``, with more ``args``."""
    command = [sys.executable, "-m", "trainvitals", "demo", "--server", server.url]
    return [*command, "--run-name", name, *args]


def demo_training(
    server: ServerProcess, name: str, epochs: int = 200, pace: float = 0.05
) -> subprocess.Popen[bytes]:
    """A real Keras run (the demo's CNN on scikit-learn digits) streaming to ``server``,
    paced so it lasts while a test looks at it."""
    return subprocess.Popen(
        demo_command(server, name, "--epochs", str(epochs), "--pace", str(pace)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def in_cgroup(group: Path) -> list[str]:
    """A command prefix that moves the command into the cgroup directory ``group`` before it
    execs."""
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"']


def run_in_cgroup(
    group: Path, *command: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` inside the cgroup directory ``group`` (moved in before it execs)."""
    return subprocess.run(
        [*in_cgroup(group), *command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- a team server's tokens and runs (tests/e2e/test_auth.py, the dashboard's sign-in) --------


def trainvitals(*args: str) -> subprocess.CompletedProcess[str]:
    """``trainvitals ARGS`` in a subprocess; its output, captured."""
    return subprocess.run(
        [sys.executable, "-m", "trainvitals", *args], capture_output=True, text=True, timeout=60
    )


def create_token(db: str, project: str, role: str, name: str) -> str:
    """A token of ``role`` on ``project`` in the database ``db``, made by the store call that
    ``trainvitals token create`` makes, in this process: the command's start-up, a second or
    two a token, added up to minutes of the suite. ``test_auth`` runs the command itself."""
    from trainvitals.server.store import Store

    store = Store(db)
    try:
        store.create_schema()
        return store.tokens.create(name, project, role)
    finally:
        store.dispose()


def ingest_refusal(server: ServerProcess, token: str, project: str) -> tuple[int, str]:
    """How the server refuses an agent connection made with ``token``: the HTTP status and
    detail of an upgrade refused (a token unknown, revoked, or of another role), or the close
    code and reason as its ``hello`` for a new run of ``project`` arrives (an AssertionError
    when it welcomes it instead). One round trip, where a refused :func:`stream` waits out its
    run's end."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    hello = {"type": "hello", "v": 1, "run_id": uuid.uuid4().hex, "project": project,
             "name": "refused?", "started_at": time.time()}  # fmt: skip
    url = server.url.replace("http", "ws", 1) + "/api/v1/ingest"
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            try:
                ws.send(json.dumps(hello))
                answer = ws.recv(timeout=10)
            except ConnectionClosed as closed:
                assert closed.rcvd is not None, "closed without a code"
                return closed.rcvd.code, closed.rcvd.reason
    except InvalidStatus as refused:
        response = refused.response
        return response.status_code, str(json.loads(response.body or b"{}").get("detail", ""))
    raise AssertionError(f"the server answered {answer!r} instead of refusing")


def stream(server: ServerProcess, token: str, project: str) -> str:
    """A run of ``project`` with a NaN loss, streamed with ``token``; returns its id."""
    from trainvitals import Run, resolve

    run = Run(resolve(server=server.url, project=project, token=token), system_metrics=False,
              watchdog=False)  # fmt: skip
    run.start()
    run.log(1, {"loss": 0.5})
    run.log(2, {"loss": float("nan"), "nonfinite/loss": 1.0})
    assert run.finish()
    return run.id
