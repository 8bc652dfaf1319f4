"""The contract's REST routes, on a real server fed by the real agent transport."""

from __future__ import annotations

import math
import urllib.parse

import numpy as np

from harness.polling import wait_for
from harness.processes import RUN_CONTRACT_FIELDS, ServerProcess, run_series
from trainvitals import Run, resolve


def stream_run(server: ServerProcess, steps: int, name: str = "r", **values_at: float) -> Run:
    run = Run(
        resolve(server=server.url, project="api", run_name=name, config={"lr": 3e-4}),
        system_metrics=False,  # only the series logged here
    )
    run.start()
    for step in range(1, steps + 1):
        run.log(step, {"loss": 1.0 / step, "accuracy": step / steps, **values_at}, time_=1e9 + step)
    return run


def test_runs_run_and_series_shapes(server: ServerProcess) -> None:
    run = stream_run(server, 50, name="shapes")
    assert run.finish()
    runs = server.get("/api/v1/runs")["runs"]
    assert [r["id"] for r in runs] == [run.id]
    listed = runs[0]
    assert set(listed) >= RUN_CONTRACT_FIELDS
    assert (listed["status"], listed["end_reason"], listed["last_step"]) == (
        "finished",
        "completed",
        50,
    )

    detail = server.get(f"/api/v1/runs/{run.id}")
    assert detail["config"] == {"lr": 3e-4}
    assert detail["env"]["python"] and detail["pid"] > 0
    assert detail["series"] == ["accuracy", "loss"]

    series = server.get(f"/api/v1/runs/{run.id}/series?name=loss")["series"]
    assert set(series) == {"loss"}
    loss = series["loss"]
    assert loss["step"] == list(range(1, 51))
    assert loss["time"] == [1e9 + s for s in range(1, 51)]
    assert loss["value"] == [1.0 / s for s in range(1, 51)]
    everything = server.get(f"/api/v1/runs/{run.id}/series")["series"]
    assert set(everything) == {"loss", "accuracy"}

    assert server.get(f"/api/v1/runs/{run.id}/alerts") == {"alerts": []}
    assert server.get("/api/v1/alerts?state=firing") == {"alerts": []}


def test_series_route_downsamples_keeping_spikes_and_nan(server: ServerProcess) -> None:
    run = Run(resolve(server=server.url, run_name="long"))
    run.start()
    values = np.sin(np.arange(1, 20_001) / 300.0)
    values[7_001] = 25.0  # one-step spike at step 7002
    values[15_000] = math.nan
    for step, value in enumerate(values, start=1):
        run.log(step, {"loss": float(value)})
    assert run.finish()
    loss = run_series(server, run.id, "loss", max_points=400)["loss"]
    assert loss["count"] == 20_000
    assert len(loss["step"]) <= 400
    assert loss["step"] == sorted(loss["step"])
    assert 25.0 in loss["value"] and None in loss["value"]  # the NaN comes back as null
    assert max(v for v in loss["value"] if v is not None) == 25.0


def test_unknown_run_is_404_with_a_clear_message(server: ServerProcess) -> None:
    for path in (
        "/api/v1/runs/nope",
        "/api/v1/runs/nope/series?name=loss",
        "/api/v1/runs/nope/alerts",
    ):
        status, body = server.get_status(path)
        assert status == 404
        assert body == {"detail": "No run with id 'nope'"}


def test_bad_query_is_422(server: ServerProcess) -> None:
    status, body = server.get_status("/api/v1/runs/x/series?max_points=1")
    assert status == 422 and body["detail"][0]["loc"] == ["query", "max_points"]


def test_runs_filter_by_project(server: ServerProcess) -> None:
    a = stream_run(server, 3, name="a")
    b = Run(resolve(server=server.url, project="other", run_name="b"))
    b.start()
    assert a.finish() and b.finish()
    other = server.get("/api/v1/runs?" + urllib.parse.urlencode({"project": "other"}))["runs"]
    assert [r["name"] for r in other] == ["b"]
    wait_for(lambda: len(server.get("/api/v1/runs")["runs"]) == 2)


def test_openapi_describes_every_answer(server: ServerProcess) -> None:
    spec = server.get("/openapi.json")
    schemas = spec["components"]["schemas"]
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            if not path.startswith("/api/v1"):
                continue
            success = [code for code in operation["responses"] if code.startswith("2")]
            assert len(success) == 1, f"{method.upper()} {path}: {success}"
            content = operation["responses"][success[0]]["content"]
            if path.endswith("/export"):  # a file, in the format asked for
                assert set(content) == {"text/csv; charset=utf-8", "application/x-ndjson",
                                        "application/vnd.apache.parquet"}  # fmt: skip
                continue
            schema = content["application/json"]["schema"]
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
            assert (schema["type"] == "object" and schema.get("properties")) or schema.get(
                "additionalProperties"
            ), f"{method.upper()} {path}"
    run = schemas["ListedRun"]["properties"]
    assert {"id", "project", "name", "status", "started_at", "end_reason", "health"} <= set(run)
    assert set(schemas["RunHealth"]["properties"]) == {"worst", "rules", "firing"}
    assert "health" in schemas["RunAnswer"]["properties"]
