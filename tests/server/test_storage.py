"""The same storage code on a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from harness.processes import RUN_CONTRACT_FIELDS
from trainvitals.exceptions import StorageError
from trainvitals.protocol import Columns
from trainvitals.server.storage import RunEnd, database_url, shown_database
from trainvitals.server.store import Store


def hello(run_id: str, started_at: float = 1000.0, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "project": "proj",
        "name": f"name-{run_id}",
        "config": {"lr": 0.1},
        "host": "h",
        "pid": 42,
        "started_at": started_at,
        "env": {"python": "3.11"},
        **extra,
    }


def test_run_lifecycle(store: Store) -> None:
    with store.engine.begin() as conn:
        row = store.runs.open_run(conn, hello("r1"), now=1001.0)
        assert (row["status"], row["last_seq"]) == ("running", 0)
        store.series.add_points(
            conn, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.5, 0.4])}, now=1002.0
        )
        store.runs.end_run(conn, "r1", 2, RunEnd("exception", 1003.0, "Traceback ..."))
    run = store.runs.get_run("r1")
    assert run is not None
    assert run["status"] == "crashed" and run["end_reason"] == "exception"
    assert run["traceback"] == "Traceback ..." and run["ended_at"] == 1003.0
    assert run["last_step"] == 2 and run["series"] == ["loss"]
    assert run["config"] == {"lr": 0.1} and run["env"] == {"python": "3.11"}


def test_reconnecting_run_keeps_its_progress(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(conn, "r1", 5, {"loss": Columns([9], [9.0], [0.1])}, now=2.0)
        again = store.runs.open_run(conn, hello("r1"), now=3.0)
    assert again["last_seq"] == 5 and again["last_step"] == 9


def test_replayed_frames_are_stored_once(store: Store) -> None:
    points = {"loss": Columns([1, 2, 3], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0])}
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(conn, "r1", 1, points, now=2.0)
    with store.engine.begin() as conn:
        store.series.add_points(conn, "r1", 1, points, now=3.0)  # the same frame, replayed
    steps, _, values = store.series.read_series("r1", "loss")
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [3.0, 2.0, 1.0]


def test_series_reads_in_step_order_and_keeps_nan(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(
            conn, "r1", 2, {"loss": Columns([3, 4], [3.0, 4.0], [math.nan, math.inf])}, 2.0
        )
        store.series.add_points(
            conn, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [1.0, 2.0])}, 2.0
        )
    steps, times, values = store.series.read_series("r1", "loss")
    assert steps.tolist() == [1, 2, 3, 4]
    assert times.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert values[:2].tolist() == [1.0, 2.0] and math.isnan(values[2]) and values[3] == math.inf
    assert store.series.read_series("r1", "missing")[0].size == 0


def test_runs_are_listed_newest_first_and_by_project(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("old", started_at=1.0), now=1.0)
        store.runs.open_run(conn, hello("new", started_at=2.0, project="other"), now=2.0)
    assert [r["id"] for r in store.runs.list_runs()] == ["new", "old"]
    assert [r["id"] for r in store.runs.list_runs(project="other")] == ["new"]
    assert set(store.runs.list_runs()[0]) >= RUN_CONTRACT_FIELDS


def test_a_million_points_read_back(store: Store) -> None:
    n, per_frame = 1_000_000, 20_000
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("big"), now=1.0)
        for seq, start in enumerate(range(0, n, per_frame), start=1):
            steps = np.arange(start, start + per_frame)
            store.series.add_points(
                conn, "big", seq, {"loss": Columns(steps, steps * 0.5, np.sqrt(steps))}, 1.0
            )
    steps, times, values = store.series.read_series("big", "loss")
    assert steps.size == n and steps[-1] == n - 1 and times[10] == 5.0 and values[16] == 4.0


def test_database_urls() -> None:
    assert database_url("runs.db").startswith("sqlite:////")
    assert database_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    with pytest.raises(StorageError, match="Expected a SQLite path or a postgresql"):
        database_url("mysql://u@h/db")


def test_a_stalled_run_runs_again_when_steps_resume(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(conn, "r1", 1, {"loss": Columns([1], [1.0], [0.5])}, now=2.0)
        store.runs.mark_stalled(conn, "r1", 2, when=40.0, report="No training step for 38 s")
    stalled = store.runs.get_run("r1")
    assert stalled is not None and stalled["status"] == "stalled"
    assert stalled["stall_stacks"] == "No training step for 38 s"
    with store.engine.begin() as conn:
        store.series.add_points(conn, "r1", 3, {"loss": Columns([2], [41.0], [0.4])}, now=41.0)
    resumed = store.runs.get_run("r1")
    assert resumed is not None and resumed["status"] == "running"


def test_alerts_are_upserted_filtered_acknowledged_and_silenced(store: Store) -> None:
    from trainvitals.detect import AlertBook, Finding

    book = AlertBook()
    fired = book.apply(
        Finding("nonfinite", "", True, 7, 1010.0, "critical", "NaN", "fix", {"loss": math.nan})
    )
    assert fired is not None
    alert = fired[1]
    alert.run_id, alert.project, alert.run_name = "r1", "proj", "name-r1"
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1001.0)
        store.alerts.save_alert(conn, {**alert.as_dict(), "evidence": {"loss": "NaN"}})
    resolved = book.apply(Finding("nonfinite", "", False, 9, 1020.0))
    assert resolved is not None
    with store.engine.begin() as conn:
        store.alerts.save_alert(conn, {**resolved[1].as_dict(), "evidence": {"loss": "NaN"}})
    (row,) = store.alerts.list_alerts(run_id="r1")
    assert (row["state"], row["resolved_time"], row["evidence"]) == (
        "resolved",
        1020.0,
        {"loss": "NaN"},
    )
    assert (
        store.alerts.list_alerts(state="firing") == []
        and store.alerts.list_alerts(project="other") == []
    )
    assert store.alerts.list_alerts(severity="critical")[0]["id"] == alert.id
    with store.engine.begin() as conn:
        acked = store.alerts.acknowledge(conn, alert.id, when=1030.0, by="ana")
        assert acked is not None and acked["acknowledged_by"] == "ana"
        store.alerts.add_silence(
            conn,
            {
                "id": "s1",
                "run_id": "r1",
                "rule": "nonfinite",
                "subject": "",
                "until": 2000.0,
                "created_at": 1030.0,
                "created_by": None,
            },
        )
    assert store.alerts.get_alert(alert.id)["silenced_until"] == 2000.0  # type: ignore[index]
    assert [s["id"] for s in store.alerts.active_silences(now=1500.0)] == ["s1"]
    assert store.alerts.active_silences(now=2500.0) == []


def test_recent_points_and_last_readings(store: Store) -> None:
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1001.0)
        for seq in range(1, 6):
            store.series.add_points(
                conn,
                "r1",
                seq,
                {
                    "loss": Columns([seq], [1000.0 + seq], [1.0 / seq]),
                    "host/rss": Columns([seq], [1000.0], [seq * 10.0]),
                },
                now=1000.0 + seq,
            )
    recent = store.series.recent_points("r1", frames=2)
    assert list(recent["loss"][0]) == [4, 5]
    assert store.series.last_values("r1", ("host/",)) == {"host/rss": 50.0}


def _job_of(store: Store, run_id: str) -> str:
    run = store.runs.get_run(run_id)
    assert run is not None and run["job_id"]
    return str(run["job_id"])


def test_workers_of_one_job_are_linked_and_a_later_launch_starts_a_new_job(store: Store) -> None:
    def worker(run_id: str, name: str, at: float, key: str = "k1", project: str = "proj") -> None:
        job = {"key": key, "worker": name, "size": 3}
        with store.engine.begin() as conn:
            store.runs.open_run(conn, {**hello(run_id, at), "project": project, "job": job}, now=at)

    worker("w1", "worker:1", 1000.0)
    worker("w10", "worker:10", 1005.0)
    worker("c0", "chief:0", 1030.0)
    worker("other", "worker:0", 1031.0, project="elsewhere")  # same key, another project
    worker("w2", "worker:2", 1040.0, key="k2")  # another job
    job = _job_of(store, "c0")
    assert _job_of(store, "w1") == _job_of(store, "w10") == job
    assert len({job, _job_of(store, "other"), _job_of(store, "w2")}) == 3

    run = store.runs.get_run("w1")
    assert run is not None and run["worker"] == "worker:1"
    assert [m["id"] for m in run["job"]["runs"]] == ["c0", "w1", "w10"]  # chief, then by index
    assert {r["id"] for r in store.runs.list_runs(job=job)} == {"c0", "w1", "w10"}
    assert {"job_id", "worker"} <= set(store.runs.list_runs()[0])

    # A worker restarted hours later while the job still runs rejoins it.
    worker("w1-again", "worker:1", 9000.0)
    assert _job_of(store, "w1-again") == job
    # Once every run of the job has ended, a launch with the same key long after is new.
    with store.engine.begin() as conn:
        for run_id in ("c0", "w1", "w10", "w1-again"):
            store.runs.end_run(conn, run_id, 1, RunEnd("completed", 9100.0, None))
    worker("next", "chief:0", 9000.0 + 601)
    assert _job_of(store, "next") != job
    # ... while a run that starts with it joins it, even after it ended.
    with store.engine.begin() as conn:
        store.runs.end_run(conn, "next", 1, RunEnd("completed", 9610.0, None))
    worker("late", "worker:0", 9601.0 + 599)
    assert _job_of(store, "late") == _job_of(store, "next")
    # A run on its own has no job.
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("alone"), now=1.0)
    alone = store.runs.get_run("alone")
    assert alone is not None and alone["job_id"] is None and "job" not in alone


def test_a_database_from_before_jobs_gains_their_columns(db_url: str) -> None:
    old = Store(db_url)
    try:
        with old.engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE runs (id VARCHAR(64) PRIMARY KEY, project VARCHAR(200) NOT NULL, "
                "name VARCHAR(200) NOT NULL, status VARCHAR(16) NOT NULL, started_at FLOAT NOT "
                "NULL, ended_at FLOAT, last_step BIGINT, last_seen FLOAT NOT NULL, last_seq BIGINT "
                "NOT NULL, host VARCHAR(255) NOT NULL, pid INTEGER NOT NULL, end_reason "
                "VARCHAR(200), traceback TEXT, stalled_at FLOAT, stall_stacks TEXT, config TEXT "
                "NOT NULL, env TEXT NOT NULL)"
            )
            conn.exec_driver_sql(
                "INSERT INTO runs VALUES ('old', 'p', 'n', 'finished', 1, 2, 7, 2, 3, 'h', 1, "
                "'completed', NULL, NULL, NULL, '{}', '{}')"
            )
    finally:
        old.dispose()
    store = Store(db_url)
    try:
        store.create_schema()
        store.create_schema()  # and again: nothing left to add
        run = store.runs.get_run("old")
        assert run is not None and run["last_step"] == 7 and run["job_id"] is None
        with store.engine.begin() as conn:
            store.runs.open_run(
                conn, {**hello("new"), "job": {"key": "k", "worker": "worker:0"}}, 3.0
            )
        assert store.runs.list_runs(job=_job_of(store, "new"))[0]["worker"] == "worker:0"
    finally:
        store.dispose()


def test_a_stalled_run_is_running_again_only_on_a_new_step(store: Store) -> None:
    """The per-second samples carry the latest step: they must not end a stall."""
    sample = {"host/rss": Columns([2], [5.0], [1e9])}
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("r1"), now=1.0)
        store.series.add_points(
            conn, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.5, 0.4])}, 2.0
        )
        store.runs.mark_stalled(conn, "r1", 2, when=40.0, report="no step for 30 s")
        store.series.add_points(conn, "r1", 3, sample, now=41.0)
    run = store.runs.get_run("r1")
    assert run is not None and (run["status"], run["last_step"]) == ("stalled", 2)
    with store.engine.begin() as conn:
        store.series.add_points(conn, "r1", 4, {"loss": Columns([3], [42.0], [0.3])}, now=42.0)
    run = store.runs.get_run("r1")
    assert run is not None and (run["status"], run["last_step"]) == ("running", 3)


def test_a_database_url_is_shown_without_its_password() -> None:
    shown = shown_database("postgresql://team:hunter2@db.example:5432/tv")
    assert "hunter2" not in shown and shown.startswith("postgresql://team:***@db.example")
    assert shown_database("runs.db") == "runs.db"
