"""A real load balancer for tests and benchmarks: Debian's nginx in front of server replicas.

It runs in the foreground, with its configuration, pid file and logs in a directory of its
own, on a free port, as whoever runs the tests (it binds no privileged port and, run as
root, switches its workers to ``nobody``).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from harness.polling import wait_for
from harness.processes import ServerProcess, create_token, free_port, terminate

NGINX = "/usr/sbin/nginx"
REDIS = os.environ.get("TRAINVITALS_TEST_REDIS", "redis://127.0.0.1:6379")


def redis_url() -> str:
    """The test Redis with a database number of its own: pub/sub channels are named after it
    (:mod:`trainvitals.server.broker`), so tests running at once don't hear each other. Each
    pytest-xdist worker draws from numbers of its own (1 to 15 shared out)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # A worker that replaces a crashed one gets the next number (gw3 of 3): it shares.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    if workers > 15:
        return f"{REDIS}/{random.randrange(1, 16)}"
    share = 15 // workers
    return f"{REDIS}/{1 + worker * share + random.randrange(share)}"


_CONFIG = """\
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      '';
    }}
    map $arg_run $trainvitals_route {{
        ""      $request_id;
        default $arg_run;
    }}
    upstream trainvitals {{
        hash $trainvitals_route consistent;
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 2m;
        location / {{
            proxy_pass http://trainvitals;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $http_host;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
            proxy_buffering off;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


def nginx_config(directory: Path, port: int, upstreams: Sequence[str]) -> str:
    """An nginx configuration balancing ``upstreams`` (``host:port``) on ``port``, as
    ``deploy/nginx.conf`` does (one run's agent connections to one replica): websocket
    upgrade passed on (``/api/v1/ingest``, ``/api/v1/live``), Host and Origin as sent (the
    server's request guard checks them), long read timeouts for long-lived streams."""
    servers = "\n".join(f"        server {u} max_fails=1 fail_timeout=2s;" for u in upstreams)
    user = "user nobody nogroup;" if os.geteuid() == 0 else ""
    return _CONFIG.format(dir=directory, port=port, servers=servers, user=user)


class Balancer:
    """nginx in the foreground on ``127.0.0.1:<free port>``; ``url`` is its address."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        if not Path(NGINX).exists():
            raise RuntimeError(f"{NGINX} is missing: apt-get install nginx-light")
        self.directory = Path(tempfile.mkdtemp(prefix="trainvitals-nginx-"))
        self.directory.chmod(0o755)  # its workers (nobody, under root) write temp files here
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = self.directory / "nginx.conf"
        config.write_text(nginx_config(self.directory, self.port, upstreams))
        errors = self.directory / "error.log"  # also before the configuration is read
        command = [NGINX, "-p", str(self.directory), "-e", str(errors), "-c", str(config)]
        self.process = subprocess.Popen(
            [*command, "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(self._healthy, timeout=20, what=f"nginx on {self.url}")
        except AssertionError:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"nginx exited: {self.errors()}")
        with urllib.request.urlopen(self.url + "/healthz", timeout=5) as response:
            return bool(response.status == 200)

    def errors(self) -> str:
        log = self.directory / "error.log"
        return log.read_text() if log.exists() else ""

    def stop(self) -> None:
        terminate(self.process)
        if self.process.stderr:
            self.process.stderr.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def balancer(upstreams: Sequence[str]) -> Iterator[Balancer]:
    """nginx balancing ``upstreams`` (``host:port``) for the time of the ``with``."""
    running = Balancer(upstreams)
    try:
        yield running
    finally:
        running.stop()


class Team:
    """Replicas of one team server (one PostgreSQL database, one Redis broker, a token made
    once for all of them) behind nginx. ``replicas[i]`` may be killed and :meth:`restart`-ed
    on its port."""

    def __init__(
        self, db: str, broker: str, count: int = 2, env: dict[str, str] | None = None
    ) -> None:
        self.db, self.broker = db, broker
        self.token = create_token(db, "*", "admin", "team")
        self._env = env or {}
        self.ports = [free_port() for _ in range(count)]
        self.replicas: list[ServerProcess] = []
        try:
            self.replicas = [self._serve(port) for port in self.ports]
            self.balancer = Balancer([f"127.0.0.1:{port}" for port in self.ports])
        except BaseException:
            self.stop()
            raise
        self.url = self.balancer.url

    def _serve(self, port: int) -> ServerProcess:
        args = ["--auth", "required", "--broker", self.broker]
        return ServerProcess(self.db, self._env, port=port, args=args, token=self.token)

    def restart(self, index: int) -> ServerProcess:
        """Start replica ``index`` again, on its port (after it was stopped or killed)."""
        self.replicas[index].stop()
        self.replicas[index] = self._serve(self.ports[index])
        return self.replicas[index]

    def stop(self) -> None:
        if hasattr(self, "balancer"):
            self.balancer.stop()
        for replica in self.replicas:
            replica.stop()


@contextmanager
def team(db: str, broker: str, count: int = 2, env: dict[str, str] | None = None) -> Iterator[Team]:
    """``count`` replicas serving ``db`` with ``broker`` (and ``TRAINVITALS_*`` settings in
    ``env``), behind nginx."""
    running = Team(db, broker, count, env)
    try:
        yield running
    finally:
        running.stop()
