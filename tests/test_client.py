"""``trainvitals.Api`` (#20) against a real server with real tokens: runs, a run's history at
full resolution as a DataFrame, its alerts, and the server's reasons as ``ApiError``."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas
import pytest

import trainvitals
from harness.polling import wait_for
from harness.processes import ServerProcess, create_token, free_port, stream
from trainvitals import Run, resolve
from trainvitals.client import ApiRun
from trainvitals.exceptions import ApiError, ConfigurationError
from trainvitals.protocol import Columns


@dataclass
class Team:
    server: ServerProcess
    reader: str  # read on project p
    ingest: str  # ingest on project p


@pytest.fixture
def team(db_url: str) -> Iterator[Team]:
    """A server with auth required, on each of SQLite and PostgreSQL."""
    reader = create_token(db_url, "p", "read", "notebook")
    ingest = create_token(db_url, "p", "ingest", "agents")
    server = ServerProcess(db_url, args=["--auth", "required"])
    try:
        yield Team(server, reader, ingest)
    finally:
        server.stop()


def test_runs_history_and_alerts(team: Team) -> None:
    nan_run = stream(team.server, team.ingest, "p")  # NaN loss at step 2: a nonfinite alert
    run = Run(resolve(server=team.server.url, project="p", run_name="long", token=team.ingest,
                      config={"lr": 0.1}), system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    values = np.sin(np.arange(30_000) / 100.0)
    values[[10, 11, 12, 13]] = [math.nan, math.inf, -math.inf, -0.0]
    steps = np.arange(1, values.size + 1)
    times = 1.7e9 + steps * 0.01
    for start in range(0, values.size, 500):
        part = slice(start, start + 500)
        run.add_columns({"loss": Columns(steps[part].tolist(), times[part].tolist(),
                                         values[part].tolist())})  # fmt: skip
    assert run.finish("exception")

    with trainvitals.Api(server=team.server.url, token=team.reader) as api:
        listed = api.runs(project="p")
        assert [r.id for r in listed] == [run.id, nan_run] and all(
            isinstance(r, ApiRun) for r in listed
        )
        assert listed[0].status == "crashed" and listed[0].last_step == values.size
        assert listed[0].end_reason == "exception"
        assert [r.id for r in api.runs(status="crashed")] == [run.id]
        assert [r.id for r in api.runs(project="p", status="finished")] == [nan_run]
        assert api.runs(project="q") == []  # another project: nothing, as the route says
        best = api.runs(sort="min:loss", descending=False, metrics=["loss", "none"])
        finite = values[np.isfinite(values)]
        assert [(r.id, r.metrics) for r in best] == [
            (run.id, {"loss": {"step": values.size, "last": values[-1],
                               "min": finite.min(), "max": finite.max()}}),
            (nan_run, {"loss": {"step": 2, "last": None, "min": 0.5, "max": 0.5,
                                "nonfinite": "nan"}}),
        ]  # fmt: skip
        assert [r.id for r in api.runs(sort="max:loss")] == [run.id, nan_run]
        assert [r.id for r in api.runs(sort="last:loss")] == [run.id, nan_run]  # NaN last
        assert listed[0].metrics == {}  # none asked for

        detail = api.run(run.id)
        assert detail.config == {"lr": 0.1} and detail.series == ["loss"]
        assert detail.metrics == best[0].metrics  # a run's page has every series' summary
        assert set(api.run(nan_run).metrics) == {"loss", "nonfinite/loss"}
        for fmt in ("parquet", "jsonl"):
            frame = detail.history(["loss"], format=fmt)
            assert list(frame.columns) == ["name", "step", "time", "value"]
            assert isinstance(frame["name"].dtype, pandas.CategoricalDtype)
            assert frame["step"].to_numpy().tobytes() == steps.astype(np.int64).tobytes()
            assert frame["time"].to_numpy().tobytes() == times.tobytes()
            assert frame["value"].to_numpy().tobytes() == values.tobytes(), fmt
        window = detail.history(["loss"], min_step=100, max_step=199)
        assert window["step"].tolist() == list(range(100, 200))
        assert window["value"].to_numpy().tobytes() == values[99:199].tobytes()
        everything = api.run(nan_run).history()
        assert sorted(set(everything["name"])) == ["loss", "nonfinite/loss"]
        assert api.run(nan_run).history(["loss"], format="jsonl")["step"].tolist() == [1, 2]

        alerts = wait_for(lambda: api.run(nan_run).alerts(), what="the nonfinite alert")
        assert alerts[0]["rule"] == "nonfinite" and alerts[0]["run_id"] == nan_run
        ending = wait_for(lambda: api.run(run.id).alerts(state="firing"), what="crash alert")
        assert [a["rule"] for a in ending] == ["crash"]
        assert ending[0]["severity"] == "critical" and ending[0]["evidence"]


def test_errors_carry_the_servers_status_and_reason(team: Team) -> None:
    with trainvitals.Api(server=team.server.url, token=team.reader) as api:
        with pytest.raises(ApiError) as missing:
            api.run("nope")
        assert (missing.value.status, missing.value.reason) == (404, "No run with id 'nope'")
        run_id = stream(team.server, team.ingest, "p")
        with pytest.raises(ApiError, match=r"404: Run .* has no series 'lost'"):
            api.run(run_id).history(["lost"])
        with pytest.raises(ApiError) as bad:
            api.runs(status="sleeping")  # type: ignore[arg-type]
        assert bad.value.status == 422 and bad.value.reason.startswith("query.status.0: ")
        for sort in ("median:loss", "min:", "loss", "min:a\nb", "min:" + "x" * 257):
            with pytest.raises(ApiError) as bad:
                api.runs(sort=sort)
            assert bad.value.status == 422 and bad.value.reason.startswith("query.sort: "), sort
        with pytest.raises(ApiError) as bad:
            api.runs(metrics=[f"m{i}" for i in range(21)])
        assert bad.value.status == 422 and bad.value.reason.startswith("query.metric: ")
    with trainvitals.Api(server=team.server.url) as anonymous:
        with pytest.raises(ApiError, match="401: a token is required"):
            anonymous.runs()
    with trainvitals.Api(server=team.server.url, token=team.ingest) as agents:
        with pytest.raises(ApiError) as refused:
            agents.run(run_id)
        assert refused.value.status == 403
    with trainvitals.Api(server=f"http://127.0.0.1:{free_port()}") as nobody:
        with pytest.raises(ApiError, match="could not read from") as unreached:
            nobody.runs()
        assert unreached.value.status is None
        # Refused before any request (no server is there to answer): no run to export.
        with pytest.raises(ConfigurationError, match="a list of at least one"):
            nobody.export([], to=io.BytesIO())


def test_server_and_token_come_from_the_environment(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINVITALS_SERVER", team.server.url)
    monkeypatch.setenv("TRAINVITALS_TOKEN", team.reader)
    with trainvitals.Api() as api:
        assert api.server == team.server.url and api.runs() == []
    with pytest.raises(ConfigurationError, match="Expected a server URL like"):
        trainvitals.Api(server="ftp://somewhere")


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_import_stays_light_and_a_missing_httpx_says_what_to_install(tmp_path: Path) -> None:
    loaded = run_python(
        "import sys, trainvitals; before = sorted(m for m in ('httpx', 'pandas') if m in "
        "sys.modules); trainvitals.Api('http://127.0.0.1:1'); "
        "print(before, sorted(m for m in ('httpx', 'pandas') if m in sys.modules))"
    )
    assert loaded == "[] ['httpx']"  # pandas only once a history is asked for
    said = run_python(
        "import sys; sys.modules['httpx'] = None; import trainvitals\n"
        "try:\n    trainvitals.Api()\nexcept trainvitals.ConfigurationError as e:\n    print(e)"
    )
    assert said == "trainvitals.Api needs httpx: pip install 'trainvitals[client]'"


def test_a_server_without_pyarrow_answers_501_and_history_reads_json_lines(
    tmp_path: Path,
) -> None:
    shadow = tmp_path / "no-pyarrow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('pyarrow is not installed here')\n")
    path = os.pathsep.join([str(shadow.parent), *sys.path])
    server = ServerProcess(str(tmp_path / "x.db"), extra_env={"PYTHONPATH": path})
    try:
        run_id = stream(server, "", "p")
        with trainvitals.Api(server=server.url) as api:
            with pytest.raises(ApiError) as refused:
                api.run(run_id).history(["loss"], format="parquet")
            assert refused.value.status == 501
            assert "pip install 'trainvitals[parquet]'" in refused.value.reason
            frame = api.run(run_id).history(["loss"])  # parquet asked, JSON Lines read
            assert frame["step"].tolist() == [1, 2] and math.isnan(frame["value"][1])
    finally:
        server.stop()


def test_the_clients_alert_tokens_and_sorts_are_the_servers() -> None:
    """``trainvitals.client.Alert`` is the light twin of the server's ``AlertRow``, its tokens
    the twins of the tokens routes' answers, and its sort keys those of the runs list (the
    client imports nothing of the server)."""
    from typing import get_args

    from trainvitals.client import Alert, MetricSummary, NewToken, RunSort, Token
    from trainvitals.server.answers import NewTokenAnswer, TokenAnswer
    from trainvitals.server.storage import AlertRow
    from trainvitals.server.storage import MetricSummary as ServerSummary
    from trainvitals.server.storage.run_queries import SORTS

    assert list(Alert.__annotations__) == list(AlertRow.__annotations__)
    assert list(Token.__annotations__) == list(TokenAnswer.__annotations__)
    assert list(NewToken.__annotations__) == list(NewTokenAnswer.__annotations__)
    assert list(MetricSummary.__annotations__) == list(ServerSummary.__annotations__)
    assert get_args(RunSort) == SORTS


def test_the_clients_run_health_is_the_servers() -> None:
    from trainvitals.client import RunHealth
    from trainvitals.server.storage import RunHealth as ServerHealth

    assert list(RunHealth.__annotations__) == list(ServerHealth.__annotations__)


def test_runs_filtered_sorted_paged_edited_and_deleted(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = create_token(db_url, "*", "admin", "lead")
    ingest = create_token(db_url, "*", "ingest", "agents")
    server = ServerProcess(db_url, args=["--auth", "required"])
    try:
        first, second, third = (stream(server, ingest, p) for p in ("p", "p", "q"))
        with trainvitals.Api(server=server.url, token=admin) as api:
            assert api.projects() == ["p", "q"]
            run = api.run(second).edit(name="lr-3e-4", tags=["sweep"], notes="warmup 500")
            assert (run.id, run.name, run.tags, run.notes) == (second, "lr-3e-4", ["sweep"],
                                                                "warmup 500")  # fmt: skip
            assert run.health["worst"] is not None and run.archived is False
            assert [r.id for r in api.runs(tag="sweep")] == [second]
            assert [r.id for r in api.runs(name="3e-4")] == [second]
            oldest_first = [r.id for r in api.runs(sort="started_at", descending=False)]
            assert oldest_first == [first, second, third]
            assert [r.id for r in api.runs(limit=1, offset=1)] == [second]
            monkeypatch.setattr(trainvitals.client, "_PAGE", 2)  # every run, two a request
            assert [r.id for r in api.runs(limit=None)] == [third, second, first]
            assert [r.id for r in api.runs(status=["finished", "crashed"], project="q")] == [third]
            api.run(first).edit(archived=True)
            assert [r.id for r in api.runs(archived="only")] == [first]
            api.run(third).delete()
            assert [r.id for r in api.runs()] == [second]
            with pytest.raises(ApiError) as missing:
                api.run(third)
            assert missing.value.status == 404
    finally:
        server.stop()


def test_an_admin_manages_tokens_from_a_script(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    admin = create_token(db, "p", "admin", "lead-p")
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        with trainvitals.Api(server=server.url, token=admin) as api:
            made = api.create_token("ci agents", "p", "ingest")
            assert made["token"].startswith(f"tv_{made['id']}_")
            assert [(t["name"], t["current"]) for t in api.tokens()] == [
                ("lead-p", True), ("ci agents", False),
            ]  # fmt: skip
            stream(server, made["token"], "p")
            revoked = api.revoke_token(made["id"])
            assert revoked["revoked_at"] is not None and "token" not in revoked
            with pytest.raises(ApiError) as refused:
                api.create_token("x", "q", "read")
            assert refused.value.status == 403 and "project 'p'" in str(refused.value)
    finally:
        server.stop()
