"""Finding runs (search, filters, sort, pages) and changing them (rename, tags, notes,
archive, delete) through the REST API of a real server (#17)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from harness.polling import wait_for
from harness.processes import ServerProcess, create_token, stream
from trainvitals import Run, resolve


def finished_run(server: ServerProcess, name: str, steps: int = 3, project: str = "p") -> str:
    run = Run(resolve(server=server.url, project=project, run_name=name, config={"lr": 0.1}),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    for step in range(1, steps + 1):
        run.log(step, {"loss": 1.0 / step})
    assert run.finish()
    return run.id


def total_count(server: ServerProcess, path: str) -> tuple[int, list[str]]:
    with urllib.request.urlopen(server.url + path, timeout=10) as response:
        answer = json.loads(response.read())
        assert int(response.headers["X-Total-Count"]) == answer["total"]
    return answer["total"], [run["name"] for run in answer["runs"]]


def test_the_runs_list_is_searched_filtered_sorted_and_paged(server: ServerProcess) -> None:
    for name in ("alpha-1", "beta-2", "alpha-3", "gamma"):
        finished_run(server, name, steps=len(name))
    assert total_count(server, "/api/v1/runs?limit=2") == (4, ["gamma", "alpha-3"])
    assert total_count(server, "/api/v1/runs?limit=2&offset=2") == (4, ["beta-2", "alpha-1"])
    assert total_count(server, "/api/v1/runs?q=ALPHA") == (2, ["alpha-3", "alpha-1"])
    assert total_count(server, "/api/v1/runs?sort=name&order=asc&limit=1") == (4, ["alpha-1"])
    by_step = total_count(server, "/api/v1/runs?sort=last_step&order=desc")[1]
    assert by_step[:2] == ["alpha-3", "alpha-1"]  # 7 steps each, then the newer first
    assert total_count(server, "/api/v1/runs?status=crashed") == (0, [])
    assert total_count(server, "/api/v1/runs?status=finished&q=gam") == (1, ["gamma"])
    listed = server.get("/api/v1/runs?config=lr&limit=1")["runs"][0]
    assert listed["config"] == {"lr": 0.1} and listed["tags"] == [] and not listed["archived"]
    for bad in ("sort=secret_hash", "order=up", "status=dead", "limit=0", "offset=-1",
                "archived=maybe", "q=" + "x" * 201):  # fmt: skip
        status, answer = server.get_status(f"/api/v1/runs?{bad}")
        assert status == 422, (bad, answer)


def test_a_run_is_renamed_tagged_noted_archived_and_deleted(server: ServerProcess) -> None:
    run_id = finished_run(server, "lr-3e-4")
    other = finished_run(server, "other")
    path = f"/api/v1/runs/{run_id}"
    body: dict[str, object] = {
        "name": " lr 3e-4, warm-up ",
        "tags": ["base", "lr", "base"],
        "notes": "first try\n\tok",
    }
    status, edited = server.send("PATCH", path, body)
    assert status == 200, edited
    assert (edited["name"], edited["tags"], edited["notes"]) == (
        "lr 3e-4, warm-up",
        ["base", "lr"],
        "first try\n\tok",
    )
    detail = server.get(path)
    assert (detail["name"], detail["tags"], detail["archived"]) == edited_fields(edited)
    assert server.get("/api/v1/runs?tag=lr")["total"] == 1
    assert server.get("/api/v1/runs?tag=l")["total"] == 0  # a whole tag, not a part

    for bad in ({"name": "a\x00b"}, {"name": "  "}, {"name": "x" * 201}, {"tags": ['"q"']},
                 {"tags": ["a,b"]}, {"tags": ["t"] * 33}, {"notes": "bell\x07"},
                 {"archived": "yes"}, {"owner": "me"}):  # fmt: skip
        status, answer = server.send("PATCH", path, bad)
        assert status == 422, (bad, answer)
    assert server.send("PATCH", "/api/v1/runs/nope", {"name": "x"})[0] == 404

    assert server.send("PATCH", path, {"archived": True})[0] == 200
    assert [r["id"] for r in server.get("/api/v1/runs")["runs"]] == [other]
    assert [r["id"] for r in server.get("/api/v1/runs?archived=only")["runs"]] == [run_id]
    assert server.get("/api/v1/runs?archived=include")["total"] == 2

    assert server.send("DELETE", path) == (200, {"deleted": run_id})
    assert server.get_status(path)[0] == 404
    assert server.get_status(path + "/series")[0] == 404
    assert server.send("DELETE", path)[0] == 404
    assert [r["id"] for r in server.get("/api/v1/runs?archived=include")["runs"]] == [other]


def test_archived_runs_past_their_days_are_deleted_by_the_server(tmp_path: Path) -> None:
    # 0.00002 days: 1.7 s after it is archived, checked every 0.2 s.
    env = {"TRAINVITALS_DELETE_ARCHIVED_AFTER_DAYS": "0.00002,kept=0",
           "TRAINVITALS_COMPACT_INTERVAL": "0.2"}  # fmt: skip
    server = ServerProcess(str(tmp_path / "tv.db"), extra_env=env)
    try:
        gone, back, listed = (finished_run(server, name) for name in ("gone", "back", "listed"))
        forever = finished_run(server, "forever", project="kept")
        for run_id in (gone, back, forever):
            assert server.send("PATCH", f"/api/v1/runs/{run_id}", {"archived": True})[0] == 200
        assert server.send("PATCH", f"/api/v1/runs/{back}", {"archived": False})[0] == 200
        wait_for(lambda: server.get_status(f"/api/v1/runs/{gone}")[0] == 404, timeout=20,
                 what="the archived run deleted")  # fmt: skip
        left = {r["id"] for r in server.get("/api/v1/runs?archived=include")["runs"]}
        assert left == {back, listed, forever}
    finally:
        server.stop()


def edited_fields(run: dict[str, object]) -> tuple[object, object, object]:
    return run["name"], run["tags"], run["archived"]


def test_a_running_run_cannot_be_deleted_and_its_alerts_go_with_it(server: ServerProcess) -> None:
    run = Run(resolve(server=server.url, project="p"), system_metrics=False, watchdog=False)
    run.start()
    run.log(1, {"loss": 0.5})
    run.log(2, {"loss": float("nan"), "nonfinite/loss": 1.0})
    wait_for(lambda: server.get(f"/api/v1/runs/{run.id}")["last_step"] == 2, what="the NaN")
    status, answer = server.send("DELETE", f"/api/v1/runs/{run.id}")
    assert status == 409 and "running" in answer["detail"]
    assert run.finish()
    assert [a["run_id"] for a in server.get("/api/v1/alerts")["alerts"]] == [run.id]
    assert server.send("DELETE", f"/api/v1/runs/{run.id}")[0] == 200
    assert server.get("/api/v1/alerts")["alerts"] == []


def test_a_zoom_reads_the_range_at_full_detail(server: ServerProcess) -> None:
    run_id = finished_run(server, "long", steps=5000)
    whole = server.get(f"/api/v1/runs/{run_id}/series?name=loss&max_points=100")["series"]["loss"]
    assert len(whole["step"]) <= 100 and whole["count"] == 5000
    path = f"/api/v1/runs/{run_id}/series?name=loss&max_points=100&min_step=1000&max_step=1049"
    part = server.get(path)["series"]["loss"]
    assert part["step"] == list(range(1000, 1050)) and part["count"] == 50
    empty = server.get(path.replace("min_step=1000", "min_step=2000"))["series"]["loss"]
    assert empty == {"step": [], "time": [], "value": [], "count": 0}  # an empty range
    status, _ = server.get_status(path.replace("min_step=1000", f"min_step={2**64}"))
    assert status == 422  # beyond any step: refused, not an overflow


def test_only_an_admin_of_its_project_edits_or_deletes_a_run(tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    tokens = {
        role: create_token(db, "p", role, f"{role}-p") for role in ("ingest", "read", "admin")
    }
    elsewhere = create_token(db, "q", "admin", "admin-q")
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        run_id = stream(server, tokens["ingest"], "p")
        path = f"/api/v1/runs/{run_id}"
        for token, expected in ((None, 401), (tokens["read"], 403), (tokens["ingest"], 403),
                                (elsewhere, 404)):  # fmt: skip
            server.token = token
            assert server.send("PATCH", path, {"name": "x"})[0] == expected, token
            assert server.send("DELETE", path)[0] == expected, token
        server.token = tokens["read"]
        assert server.get("/api/v1/runs?q=")["total"] == 1
        server.token = elsewhere
        assert server.get("/api/v1/runs?project=p") == {"runs": [], "total": 0}
        server.token = tokens["admin"]
        assert server.send("PATCH", path, {"tags": ["kept"]})[0] == 200
        assert server.send("DELETE", path)[0] == 200
    finally:
        server.stop()
