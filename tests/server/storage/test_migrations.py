"""Schema migrations (Alembic): a fresh database, one made by release 0.1.0 before
migrations, replicas starting together, and ``trainvitals db upgrade``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, MetaData, String, Table, text

from harness.processes import trainvitals
from trainvitals.exceptions import StorageError
from trainvitals.server.migrations import (
    alembic_config,
    current_revision,
    head_revision,
    target_metadata,
    upgrade,
)
from trainvitals.server.store import Store

RELEASE_0_1_0 = Path(__file__).with_name("release_0_1_0.sql")


def differences(engine: Engine, metadata: MetaData = target_metadata) -> list[Any]:
    """What autogenerate would write: the models against the migrated database."""
    with engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), metadata))


def make_release_0_1_0(store: Store) -> None:
    """The database 0.1.0's ``create_schema`` made, with a run and a token in it."""
    ddl = RELEASE_0_1_0.read_text()
    if store.dialect == "postgresql":
        ddl = ddl.replace(" BLOB ", " BYTEA ")
    statements = [line for line in ddl.splitlines() if line and not line.startswith("--")]
    with store.engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
        # A run as 0.1.0 wrote it (today's RunStore reads columns that release lacks).
        conn.execute(
            text(
                "INSERT INTO runs (id, project, name, status, started_at, last_seen, last_seq,"
                " host, pid, config, env) VALUES ('old', 'proj', 'name-old', 'running', 1000.0,"
                " 3.0, 0, 'h', 42, '{\"lr\": 0.1}', '{\"python\": \"3.11\"}')"
            )
        )
    store.tokens.create("ci", "*", "read")


def test_a_fresh_database_migrates_to_the_models_exactly(db_url: str) -> None:
    store = Store(db_url)
    try:
        assert store.create_schema() == head_revision()
        assert differences(store.engine) == []
        # The comparison sees a column a model has and no revision made (a forgotten one).
        forgotten = MetaData()
        for table in target_metadata.sorted_tables:
            table.to_metadata(forgotten)
        Table("runs", forgotten, Column("forgotten", String(10)), extend_existing=True)
        assert [d[0] for d in differences(store.engine, forgotten)] == ["add_column"]
    finally:
        store.dispose()


def test_a_database_of_release_0_1_0_is_adopted_and_upgraded(db_url: str) -> None:
    store = Store(db_url)
    try:
        make_release_0_1_0(store)
        with store.engine.connect() as conn:
            assert current_revision(conn) is None
        assert store.create_schema() == head_revision()
        assert store.create_schema() == head_revision()  # and again: nothing to do
        assert differences(store.engine) == []
        run = store.runs.get_run("old")
        assert run is not None and run["name"] == "name-old" and run["config"] == {"lr": 0.1}
        assert [t.name for t in store.tokens.list()] == ["ci"]
    finally:
        store.dispose()


def test_runs_archived_before_revision_0006_count_their_days_from_the_upgrade(
    db_url: str,
) -> None:
    store = Store(db_url)
    try:
        with store.engine.connect() as conn:
            command.upgrade(alembic_config(conn), "0005")
            conn.commit()
            for run_id, archived in (("a", True), ("b", False), ("c", None)):
                conn.execute(
                    text(
                        "INSERT INTO runs (id, project, name, status, started_at, last_seen,"
                        " last_seq, host, pid, config, env, archived) VALUES (:id, 'p', :id,"
                        " 'finished', 1.0, 2.0, 0, 'h', 1, '{}', '{}', :archived)"
                    ),
                    {"id": run_id, "archived": archived},
                )
            conn.commit()
        before = time.time()
        assert store.create_schema() == head_revision()
        with store.engine.connect() as conn:
            since: dict[str, float | None] = dict(
                conn.execute(text("SELECT id, archived_at FROM runs")).tuples().all()
            )
        when = since["a"]
        assert when is not None and before <= when <= time.time()
        assert since["b"] is since["c"] is None
    finally:
        store.dispose()


def test_shared_clocks_go_back_into_their_blocks_below_revision_0007_and_read_after(
    db_url: str,
) -> None:
    """Downgraded below 0007, every block holds its steps and times again, as revision 0006's
    code reads them; upgraded again, those blocks (with no clock) read as they are."""
    import numpy as np

    from tests.server.storage.rows import hello
    from trainvitals.protocol import ArrayColumns, Columns
    from trainvitals.server.storage import codec
    from trainvitals.server.storage.series import Due

    def same(a: ArrayColumns, b: ArrayColumns) -> bool:
        return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))

    steps = np.arange(1000)
    times = 1.7e9 + steps * 0.01
    sent = {name: Columns(steps, times, np.sin(steps + i)) for i, name in enumerate("abc")}
    store = Store(db_url)
    try:
        store.create_schema()
        with store.transaction() as work:
            store.runs.open_run(work, hello("r"), now=1.0)
            store.series.add_points(work, "r", 1, sent, now=2.0)
        store.series.compact(Due("r", 1, True))
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM clocks")).scalar() == 1
            command.downgrade(alembic_config(conn), "0006")
            conn.commit()
            rows = conn.execute(
                text("SELECT series, encoding, n, steps, times, vals FROM chunks ORDER BY series")
            ).all()
        assert [(row[0], row[1]) for row in rows] == [(name, codec.CURRENT) for name in "abc"]
        for row in rows:
            assert same(codec.decode([row[1:]]), sent[row[0]])
        assert store.create_schema() == head_revision()
        for name, columns in sent.items():
            assert same(store.series.read_series("r", name), columns)
    finally:
        store.dispose()


def test_replicas_starting_together_migrate_once(postgres_url: str) -> None:
    stores = [Store(postgres_url) for _ in range(4)]
    start = threading.Barrier(len(stores))
    revisions: list[str] = []
    errors: list[BaseException] = []

    def replica(store: Store) -> None:
        start.wait()
        try:
            revisions.append(upgrade(store.engine))
        except BaseException as exc:  # reported below, with the others'
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(s,)) for s in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == [] and revisions == [head_revision()] * len(stores)
        with stores[0].engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
        assert versions == [(head_revision(),)]
    finally:
        for store in stores:
            store.dispose()


def test_db_upgrade_prints_the_revision_and_hides_the_password(postgres_url: str) -> None:
    # The test server trusts local connections, so any password is accepted (and must not show).
    url = postgres_url.replace("postgres@", "postgres:hunter2@", 1)
    assert "hunter2" in url
    for _ in range(2):  # the second run finds nothing to do
        done = trainvitals("db", "upgrade", "--db", url)
        assert done.returncode == 0, done.stderr
        assert "hunter2" not in done.stdout + done.stderr
        assert done.stdout.strip().endswith(f"at revision {head_revision()} (head)")
        assert "postgres:***@" in done.stdout
    refused = trainvitals("db", "upgrade", "--db", url.rsplit("/", 1)[0] + "/no_such_db")
    assert refused.returncode == 1 and "no_such_db" in refused.stderr
    assert "hunter2" not in refused.stdout + refused.stderr


def test_a_database_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "newer.db"))
    try:
        store.create_schema()
        with store.engine.begin() as conn:  # as if a later trainvitals had migrated it
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        with pytest.raises(StorageError, match=r"cannot migrate the database.*'9999'"):
            store.create_schema()
    finally:
        store.dispose()
    # serve stops before it listens, saying why.
    refused = trainvitals("serve", "--port", "0", "--db", str(tmp_path / "newer.db"))
    assert refused.returncode == 2 and "cannot migrate the database" in refused.stderr


def test_series_stored_before_revision_0008_are_summarised_by_the_upgrade(db_url: str) -> None:
    """Downgraded below 0008 the summaries are gone; upgraded again, each series' summary is
    read from its points (a compacted block with a shared clock, then frames as sent) and
    equals the one the writer kept. A series whose block lost its clock, or whose raw frame's
    values were cut at a whole point, is left without one, and the upgrade goes on."""
    import numpy as np

    from tests.server.storage.rows import hello
    from trainvitals.protocol import Columns
    from trainvitals.server.storage import RunFilter, codec
    from trainvitals.server.storage.series import Due

    steps = np.arange(1, 501)
    times = 1.7e9 + steps * 0.01
    loss = np.cos(steps / 50.0) + 2.0
    store = Store(db_url)
    try:
        store.create_schema()
        for run_id in ("r", "broken"):
            with store.transaction() as work:
                store.runs.open_run(work, hello(run_id), now=1.0)
                sent = {"loss": Columns(steps, times, loss), "acc": Columns(steps, times, -loss)}
                store.series.add_points(work, run_id, 1, sent, now=2.0)
            store.series.compact(Due(run_id, 1, True))  # the first frame: a block, its clock shared
        with store.transaction() as work:
            later = Columns([501, 502], [1.8e9, 1.8e9 + 1], [np.inf, float("nan")])
            store.series.add_points(work, "r", 2, {"loss": later}, now=3.0)
            store.runs.open_run(work, hello("torn"), now=1.0)
            two = Columns([1, 2], [1.0, 2.0], [3.0, 4.0])
            store.series.add_points(work, "torn", 1, {"loss": two}, now=2.0)
        with store.engine.begin() as conn:  # an old raw frame, its values' blob a point short
            steps2, times2, values2 = codec.encode_raw(*two)
            conn.execute(
                text("UPDATE chunks SET encoding = :raw, n = 2, steps = :s, times = :t, vals = :v,"
                     " clock = NULL WHERE run_id = 'torn'"),
                {"raw": codec.RAW, "s": steps2, "t": times2, "v": values2[:8]},
            )  # fmt: skip
        asked = RunFilter(sort="name"), 50, 0, (), ("loss", "acc")
        kept = {run["id"]: run["metrics"] for run in store.runs.find_runs(*asked)["runs"]}
        assert kept["r"]["loss"] == {"step": 502, "last": None, "min": float(loss.min()),
                                     "max": float(loss.max()), "nonfinite": "nan"}  # fmt: skip
        assert kept["r"]["acc"]["last"] == -loss[-1]
        with store.engine.connect() as conn:
            shared = conn.execute(text("SELECT count(*) FROM chunks WHERE clock IS NOT NULL"))
            assert shared.scalar() == 4  # two series of two runs, each block in a clock
            conn.execute(text("DELETE FROM clocks WHERE run_id = 'broken'"))
            command.downgrade(alembic_config(conn), "0007")
            conn.commit()
            columns = list(conn.execute(text("SELECT * FROM series")).keys())
        assert columns == ["run_id", "name"]
        assert store.create_schema() == head_revision()
        again = {run["id"]: run["metrics"] for run in store.runs.find_runs(*asked)["runs"]}
        assert again == {"r": kept["r"], "broken": {}, "torn": {}}
    finally:
        store.dispose()
