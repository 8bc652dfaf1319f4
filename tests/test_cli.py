"""The ``trainvitals`` command itself: help without a command, ``runs`` against a real
server, and ``token list`` that leaves no database behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainvitals
from harness.processes import ROOT, ServerProcess, create_token, free_port, stream
from trainvitals.cli import main


def test_no_command_prints_the_help_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trainvitals") and "runs" in out and "serve" in out


def test_runs_lists_what_the_api_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "team.db")
    reader = create_token(db, "*", "read", "viewer")
    ingest = create_token(db, "*", "ingest", "agents")
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        first, second, third = (stream(server, ingest, p) for p in ("p", "p", "q"))
        given = ["--server", server.url, "--token", reader]

        assert main(["runs", *given]) == 0
        header, *rows = capsys.readouterr().out.splitlines()
        assert header.split() == [
            "id", "project", "name", "status", "step", "started", "ended", "health", "firing"
        ]  # fmt: skip
        assert [row.split()[0] for row in rows] == [third, second, first]  # newest first
        assert rows[0].split()[1] == "q" and "completed" in rows[0]

        assert main(["runs", *given, "--project", "p", "--ascending", "--metric", "min:loss",
                     "--metric", "loss"]) == 0  # fmt: skip
        header, *rows = capsys.readouterr().out.splitlines()
        assert header.split()[-2:] == ["min:loss", "loss"]
        assert [row.split()[0] for row in rows] == [first, second]
        assert [row.split()[-2:] for row in rows] == [["0.5", "nan"], ["0.5", "nan"]]

        assert main(["runs", *given, "--json", "--limit", "2", "--metric", "loss"]) == 0
        listed = json.loads(capsys.readouterr().out)
        with trainvitals.Api(server=server.url, token=reader) as api:
            expected = api.runs(limit=2, metrics=["loss"])
        assert [r["id"] for r in listed] == [r.id for r in expected] == [third, second]
        assert listed[0]["metrics"] == expected[0].metrics and "api" not in listed[0]

        assert main(["runs", *given, "--project", "nobody"]) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and "no runs match" in captured.err

        assert main(["runs", "--server", server.url]) == 1  # no token: the server's reason
        assert "401" in capsys.readouterr().err
    finally:
        server.stop()


def test_runs_says_which_server_it_could_not_reach(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"http://127.0.0.1:{free_port()}"
    assert main(["runs", "--server", address]) == 1
    assert address in capsys.readouterr().err


def test_token_list_and_revoke_make_no_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "mistyped.db"
    assert main(["token", "list", "--db", str(db)]) == 1
    assert f"no database at {db}" in capsys.readouterr().err
    assert main(["token", "revoke", "--db", f"sqlite:///{db}", "abc"]) == 1
    assert f"no database at {db}" in capsys.readouterr().err
    assert not db.exists()
    assert main(["token", "create", "--db", str(db), "--project", "p", "--role", "read"]) == 0
    assert main(["token", "list", "--db", str(db)]) == 0
    assert "read@p" in capsys.readouterr().out


def test_make_demo_on_a_port_another_server_holds_says_so_and_trains_nothing(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The demo would have streamed into the server already there and printed its URL as its
    own."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo.sh")],
        env={**os.environ, "PY": sys.executable, "PORT": str(server.port),
             "DB": str(tmp_path / "demo.db")},
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"port {server.port} already has a trainvitals server" in done.stderr
    assert server.get("/api/v1/runs")["runs"] == []
