"""The database itself: URLs, how they are shown, and the upgrade of older databases."""

from __future__ import annotations

import pytest

from tests.server.storage.rows import hello, job_of
from trainvitals.exceptions import StorageError
from trainvitals.server.storage import database_url, shown_database
from trainvitals.server.store import Store


def test_database_urls() -> None:
    assert database_url("runs.db").startswith("sqlite:////")
    assert database_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    with pytest.raises(StorageError, match="Expected a SQLite path or a postgresql"):
        database_url("mysql://u@h/db")


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
        with store.transaction() as work:
            store.runs.open_run(
                work, {**hello("new"), "job": {"key": "k", "worker": "worker:0"}}, 3.0
            )
        assert store.runs.list_runs(job=job_of(store, "new"))[0]["worker"] == "worker:0"
    finally:
        store.dispose()


def test_a_database_url_is_shown_without_its_password() -> None:
    shown = shown_database("postgresql://team:hunter2@db.example:5432/tv")
    assert "hunter2" not in shown and shown.startswith("postgresql://team:***@db.example")
    assert shown_database("runs.db") == "runs.db"


def test_a_database_from_before_the_codec_is_migrated_reads_and_compacts(db_url: str) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from trainvitals.protocol import Columns
    from trainvitals.server.migrations import alembic_config, head_revision
    from trainvitals.server.storage import RunEnd

    old = Store(db_url)
    try:
        old.create_schema()
        with old.transaction() as work:  # rows as the packed layout wrote them
            old.runs.open_run(work, hello("old"), now=1.0)
            for seq in (1, 2):
                points = {"loss": Columns([seq], [float(seq)], [float("nan") if seq == 2 else 0.5])}
                old.series.add_points(work, "old", seq, points, now=1.0)
            old.runs.end_run(work, "old", 3, RunEnd("completed", 2.0, None))
        with old.engine.connect() as conn:  # and the tables as they were (revision 0002's down)
            command.downgrade(alembic_config(conn), "0001")
            conn.commit()
            assert "encoding" not in {c["name"] for c in inspect(conn).get_columns("chunks")}
    finally:
        old.dispose()
    store = Store(db_url)
    try:
        assert store.create_schema() == head_revision()
        steps, _, values = store.series.read_series("old", "loss")
        assert steps.tolist() == [1, 2] and values[0] == 0.5 and values[1] != values[1]
        (due,) = store.series.runs_to_compact(live_margin=10, live_after=100)
        assert store.series.compact(due) == 2
        steps, _, values = store.series.read_series("old", "loss")
        assert steps.tolist() == [1, 2] and values[0] == 0.5 and values[1] != values[1]
    finally:
        store.dispose()
