"""Private PostgreSQL and Redis servers that a test or a benchmark may stop and start at will.

The shared servers (PostgreSQL on 5432, Redis on 6379) serve every test running beside this
one: stopping them to see what an outage does would fail those. These run on a free port,
from a data directory of their own, and go with it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.polling import wait_for
from harness.processes import free_port


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (apt-get install postgresql)")
    return found[-1]


class PrivatePostgres:
    """A PostgreSQL cluster of its own (``initdb`` into a temporary directory), trust auth on
    127.0.0.1 and a free port. PostgreSQL refuses to run as root: as root it runs as the
    ``postgres`` user.

    Example:
        ```python
        with private_postgres() as pg:
            server = ServerProcess(pg.url)
            pg.stop()  # an outage
            pg.start()
        ```
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        #: The command prefix that runs PostgreSQL's programs as its own user (when root).
        self.run_as: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.run_as:
            shutil.chown(root, "postgres")
        subprocess.run(
            [*self.run_as, _postgres_bin("initdb"), "-D", str(self.data), "-U", "postgres",
             "-A", "trust", "--no-sync", "-E", "UTF8"],
            check=True, capture_output=True,
        )  # fmt: skip

    def start(self) -> None:
        """Start it and wait until it takes connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*self.run_as, _postgres_bin("pg_ctl"), "-D", str(self.data), "-o", options,
             "-l", str(self.root / "log"), "-w", "-t", "30", "start"],
            check=True, capture_output=True,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop it (``fast``: its connections are cut, as a restart by an operator does)."""
        subprocess.run(
            [*self.run_as, _postgres_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
             "-t", "30", "stop"],
            check=True, capture_output=True,
        )  # fmt: skip


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started :class:`PrivatePostgres`, stopped and deleted afterwards."""
    root = Path(tempfile.mkdtemp(prefix="tv-pg-"))
    try:
        pg = PrivatePostgres(root)
        pg.start()
        try:
            yield pg
        finally:
            subprocess.run(
                [*pg.run_as, _postgres_bin("pg_ctl"), "-D", str(pg.data), "-m", "immediate",
                 "stop"],
                capture_output=True,
            )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


class PrivateRedis:
    """``redis-server`` on a free port with no persistence, to restart at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import socket

        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

        def answers() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")

        wait_for(answers, timeout=10, what="private redis-server")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    redis = PrivateRedis()
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()
