"""The distribution as users get it: a wheel in a fresh virtualenv, the CLI, compose."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

from harness.balancer import NGINX
from harness.processes import ROOT, ServerProcess
from trainvitals.server.migrations import head_revision


def test_wheel_in_a_fresh_virtualenv_serves_the_dashboard(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    wheel = next(dist.glob("trainvitals-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    top_level = {name.split("/")[0] for name in names}
    assert {n for n in top_level if not n.endswith(".dist-info")} == {"trainvitals"}
    assert "trainvitals/web/index.html" in names and "trainvitals/server/app.py" in names
    assert {  # the schema migrations travel with the server: no alembic.ini needed
        "trainvitals/server/migrations/env.py",
        "trainvitals/server/migrations/versions/0001_baseline.py",
    } <= set(names)
    plain = [
        line
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert plain == [  # the agent install stays light: no web stack, no numerics
        "Requires-Dist: websockets>=13.0",
        "Requires-Dist: psutil>=5.9",
        "Requires-Dist: nvidia-ml-py>=12.535",
        "Requires-Dist: orjson>=3.9",
    ]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", f"{wheel}[server]"], check=True, timeout=600
    )
    light = subprocess.run(
        [
            python,
            "-c",
            "import sys, trainvitals; "
            "heavy = ('fastapi', 'plotly', 'tensorflow', 'keras', 'httpx', 'pandas'); "
            "print(sorted(m for m in heavy if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert light.stdout.strip() == "[]"

    server = ServerProcess(str(tmp_path / "wheel.db"), python=python)
    try:
        with urllib.request.urlopen(server.url + "/") as response:
            assert b'<main id="app"' in response.read()
        with urllib.request.urlopen(server.url + "/static/app.js") as response:
            assert b"LiveSocket" in response.read()
        with urllib.request.urlopen(server.url + "/static/vendor/plotly.min.js") as response:
            body = response.read()
            assert len(body) > 1_000_000 and b"plotly" in body[:2000].lower()
    finally:
        server.stop()
    # The server migrated its database with the revisions in the wheel.
    with sqlite3.connect(tmp_path / "wheel.db") as db:
        stamped = db.execute("SELECT version_num FROM alembic_version").fetchall()
    assert stamped == [(head_revision(),)]


@pytest.mark.parametrize("command", [[], ["serve"], ["demo"], ["db", "upgrade"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainvitals", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stdout.startswith("usage: trainvitals")


def test_serve_reports_a_bad_database_url(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainvitals", "serve", "--port", "0", "--db", "mysql://x@y/z"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Expected a SQLite path or a postgresql:// URL" in result.stdout + result.stderr


def test_compose_file_runs_two_replicas_behind_nginx_on_postgres_and_redis() -> None:
    compose = ROOT / "docker-compose.yml"
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        subprocess.run(
            [docker, "compose", "-f", str(compose), "config", "-q"],
            check=True,
            env={**os.environ, "POSTGRES_PASSWORD": "from-the-environment"},
        )
    spec = yaml.safe_load(compose.read_text())
    services = spec["services"]
    replicas = [services["server-1"], services["server-2"]]
    postgres, redis, balancer = services["postgres"], services["redis"], services["balancer"]
    for server in replicas:
        assert server["build"] == "." and (ROOT / "Dockerfile").is_file()
        environment = server["environment"]
        assert environment["TRAINVITALS_DB"].startswith("postgresql://")
        # No credentials in the file (#15).
        assert "${POSTGRES_PASSWORD:?" in environment["TRAINVITALS_DB"]
        assert environment["TRAINVITALS_BROKER"] == "redis://redis:6379/0"
        assert "ports" not in server  # reached through the balancer only
        assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert server["depends_on"]["redis"]["condition"] == "service_healthy"
    assert postgres["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert postgres["image"].startswith("postgres:") and redis["image"].startswith("redis:")
    assert "ports" not in redis
    volume = postgres["volumes"][0].split(":")[0]
    assert volume in spec["volumes"]
    # Published on loopback unless told otherwise, with the repository's nginx configuration.
    assert balancer["image"].startswith("nginx:")
    assert balancer["ports"] == ["${TRAINVITALS_BIND:-127.0.0.1}:8600:8600"]
    assert balancer["volumes"] == ["./deploy/nginx.conf:/etc/nginx/nginx.conf:ro"]


def test_the_compose_nginx_configuration_is_valid_and_balances_both_replicas(
    tmp_path: Path,
) -> None:
    config = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server server-1:8600" in config and "server server-2:8600" in config
    assert "proxy_set_header Upgrade $http_upgrade;" in config
    # What docs/security.md hands to the load balancer: a client's connections and rate.
    assert "limit_conn per_address" in config and "limit_req zone=requests" in config
    # Names only Docker resolves, pointed at this host for nginx's own check.
    local = tmp_path / "nginx.conf"
    local.write_text(config.replace("server-1:", "127.0.0.1:").replace("server-2:", "127.0.0.2:"))
    checked = subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(local)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr


def test_serve_refuses_a_broker_that_is_not_redis() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainvitals", "serve", "--port", "0", "--broker",
         "nats://user:hunter2@127.0.0.1:4222"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--broker expects a redis://host:6379/0 URL" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_serve_prints_the_database_and_broker_urls_without_their_passwords() -> None:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainvitals",
            "serve",
            "--port",
            "0",
            "--db",
            "postgresql://postgres:hunter2@127.0.0.1:5432/postgres",
            "--broker",
            "redis://:hunter3@127.0.0.1:6379/0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
    finally:
        server.kill()
        server.wait(30)
    assert "serving on" in first and "postgres:***@127.0.0.1" in first and "hunter2" not in first
    assert "broker: redis://:***@127.0.0.1:6379/0" in first and "hunter3" not in first
