"""Runs in storage: their lifecycle, progress, listing and the workers of a job."""

from __future__ import annotations

from sqlalchemy import select, text

from harness.processes import RUN_CONTRACT_FIELDS
from tests.server.storage.rows import alert_row, hello, job_of
from trainvitals.protocol import Columns
from trainvitals.server.storage import RunEnd, RunFilter, Silence
from trainvitals.server.storage.schema import runs
from trainvitals.server.store import Store


def test_run_lifecycle(store: Store) -> None:
    with store.transaction() as work:
        row = store.runs.open_run(work, hello("r1"), now=1001.0)
        assert (row["status"], row["last_seq"]) == ("running", 0)
        store.series.add_points(
            work, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.5, 0.4])}, now=1002.0
        )
        store.runs.end_run(work, "r1", 2, RunEnd("exception", 1003.0, "Traceback ..."))
    run = store.runs.get_run("r1")
    assert run is not None
    assert run["status"] == "crashed" and run["end_reason"] == "exception"
    assert run["traceback"] == "Traceback ..." and run["ended_at"] == 1003.0
    assert run["last_step"] == 2 and run["series"] == ["loss"]
    assert run["config"] == {"lr": 0.1} and run["env"] == {"python": "3.11"}


def test_reconnecting_run_keeps_its_progress(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(work, "r1", 5, {"loss": Columns([9], [9.0], [0.1])}, now=2.0)
        again = store.runs.open_run(work, hello("r1"), now=3.0)
    assert again["last_seq"] == 5 and again["last_step"] == 9


def test_runs_are_listed_newest_first_and_by_project(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("old", started_at=1.0), now=1.0)
        store.runs.open_run(work, hello("new", started_at=2.0, project="other"), now=2.0)
    assert [r["id"] for r in store.runs.list_runs()] == ["new", "old"]
    assert [r["id"] for r in store.runs.list_runs(project="other")] == ["new"]
    assert set(store.runs.list_runs()[0]) >= RUN_CONTRACT_FIELDS


def test_projects_are_every_runs_project_once_sorted(store: Store) -> None:
    with store.transaction() as work:
        # The oldest run's project is on no page of the newest runs: it is listed all the same.
        store.runs.open_run(work, hello("rare", started_at=1.0, project="rare"), now=1.0)
        for i in range(3):
            store.runs.open_run(work, hello(f"b{i}", started_at=2.0 + i, project="busy"), now=2.0)
        store.runs.edit_run(work, "rare", {"archived": True}, now=3.0)  # listed still
    assert store.runs.projects() == ["busy", "rare"]
    assert store.runs.projects(only="rare") == ["rare"]
    assert store.runs.projects(only="none") == []


def test_a_stalled_run_runs_again_when_steps_resume(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(work, "r1", 1, {"loss": Columns([1], [1.0], [0.5])}, now=2.0)
        store.runs.mark_stalled(work, "r1", 2, when=40.0, report="No training step for 38 s")
    stalled = store.runs.get_run("r1")
    assert stalled is not None and stalled["status"] == "stalled"
    assert stalled["stall_stacks"] == "No training step for 38 s"
    with store.transaction() as work:
        store.series.add_points(work, "r1", 3, {"loss": Columns([2], [41.0], [0.4])}, now=41.0)
    resumed = store.runs.get_run("r1")
    assert resumed is not None and resumed["status"] == "running"


def test_workers_of_one_job_are_linked_and_a_later_launch_starts_a_new_job(store: Store) -> None:
    def worker(run_id: str, name: str, at: float, key: str = "k1", project: str = "proj") -> None:
        job = {"key": key, "worker": name, "size": 3}
        with store.transaction() as work:
            store.runs.open_run(work, {**hello(run_id, at), "project": project, "job": job}, now=at)

    worker("w1", "worker:1", 1000.0)
    worker("w10", "worker:10", 1005.0)
    worker("c0", "chief:0", 1030.0)
    worker("other", "worker:0", 1031.0, project="elsewhere")  # same key, another project
    worker("w2", "worker:2", 1040.0, key="k2")  # another job
    job = job_of(store, "c0")
    assert job_of(store, "w1") == job_of(store, "w10") == job
    assert len({job, job_of(store, "other"), job_of(store, "w2")}) == 3

    run = store.runs.get_run("w1")
    assert run is not None and run["worker"] == "worker:1"
    assert [m["id"] for m in run["job"]["runs"]] == ["c0", "w1", "w10"]  # chief, then by index
    assert {r["id"] for r in store.runs.list_runs(job=job)} == {"c0", "w1", "w10"}
    assert {"job_id", "worker"} <= set(store.runs.list_runs()[0])

    # A worker restarted hours later while the job still runs rejoins it.
    worker("w1-again", "worker:1", 9000.0)
    assert job_of(store, "w1-again") == job
    # Once every run of the job has ended, a launch with the same key long after is new.
    with store.transaction() as work:
        for run_id in ("c0", "w1", "w10", "w1-again"):
            store.runs.end_run(work, run_id, 1, RunEnd("completed", 9100.0, None))
    worker("next", "chief:0", 9000.0 + 601)
    assert job_of(store, "next") != job
    # ... while a run that starts with it joins it, even after it ended.
    with store.transaction() as work:
        store.runs.end_run(work, "next", 1, RunEnd("completed", 9610.0, None))
    worker("late", "worker:0", 9601.0 + 599)
    assert job_of(store, "late") == job_of(store, "next")
    # A run on its own has no job.
    with store.transaction() as work:
        store.runs.open_run(work, hello("alone"), now=1.0)
    alone = store.runs.get_run("alone")
    assert alone is not None and alone["job_id"] is None and "job" not in alone


def test_a_stalled_run_is_running_again_only_on_a_new_step(store: Store) -> None:
    """The per-second samples carry the latest step: they must not end a stall."""
    sample = {"host/rss": Columns([2], [5.0], [1e9])}
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(
            work, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.5, 0.4])}, 2.0
        )
        store.runs.mark_stalled(work, "r1", 2, when=40.0, report="no step for 30 s")
        store.series.add_points(work, "r1", 3, sample, now=41.0)
    run = store.runs.get_run("r1")
    assert run is not None and (run["status"], run["last_step"]) == ("stalled", 2)
    with store.transaction() as work:
        store.series.add_points(work, "r1", 4, {"loss": Columns([3], [42.0], [0.3])}, now=42.0)
    run = store.runs.get_run("r1")
    assert run is not None and (run["status"], run["last_step"]) == ("running", 3)


def test_a_finished_run_keeps_how_it_ended(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.runs.end_run(work, "r1", 1, RunEnd("completed", 10.0, None))
        store.runs.end_run(work, "r1", 2, RunEnd("signal:SIGKILL", 20.0, "forged"))
    run = store.runs.get_run("r1")
    assert run is not None
    assert (run["status"], run["end_reason"], run["ended_at"]) == ("finished", "completed", 10.0)
    assert run["traceback"] is None


def test_an_end_numbered_like_a_stored_frame_still_ends_a_running_run(store: Store) -> None:
    """A killed process's last frame can be stored after its watchdog's welcome, under the
    number the watchdog gives its end (another replica read it): the run still ends."""
    with store.transaction() as work:
        store.runs.open_run(work, hello("r1"), now=1.0)
        store.series.add_points(work, "r1", 1, {"loss": Columns([1], [2.0], [0.5])}, now=2.0)
        store.series.add_points(work, "r1", 2, {"loss": Columns([2], [3.0], [0.4])}, now=3.0)
        store.runs.end_run(work, "r1", 2, RunEnd("oom_killed", 4.0, None))
        store.runs.end_run(work, "r1", 1, RunEnd("completed", 5.0, None))  # a replay: ended
    run = store.runs.get_run("r1")
    assert run is not None
    assert (run["status"], run["end_reason"], run["ended_at"]) == ("crashed", "oom_killed", 4.0)
    assert run["last_step"] == 2


def test_a_run_is_bound_to_the_secret_of_its_first_hello(store: Store) -> None:
    with store.transaction() as work:
        proposed = store.runs.open_run(work, {**hello("r0"), "run_secret": "agent's own"}, 1.0)
        made = store.runs.open_run(work, hello("r1"), now=1.0)  # none proposed: one issued
    assert proposed["owned"] and proposed["secret"] is None
    assert made["created"] and made["owned"] and made["secret"]
    with store.transaction() as work:
        again = store.runs.open_run(work, {**hello("r0"), "run_secret": "agent's own"}, 2.0)
    assert again["owned"] and not again["created"]
    with store.transaction() as work:
        store.runs.mark_lost(work, "r1", now=100.0)
        hijack = store.runs.open_run(work, hello("r1"), now=101.0)
        wrong = store.runs.open_run(work, {**hello("r1"), "run_secret": "guess"}, now=102.0)
    assert not hijack["owned"] and not wrong["owned"] and hijack["secret"] is None
    run = store.runs.get_run("r1")
    assert run is not None and run["status"] == "lost"  # no stranger revives it
    assert "secret_hash" not in run
    with store.transaction() as work:
        owner = store.runs.open_run(work, {**hello("r1"), "run_secret": made["secret"]}, 103.0)
    assert owner["owned"] and owner["secret"] is None and owner["status"] == "running"


def test_runs_are_found_by_name_status_and_tag_sorted_and_paged(store: Store) -> None:
    with store.transaction() as work:
        for i in range(12):
            store.runs.open_run(work, hello(f"r{i:02}", started_at=float(i)), now=float(i))
        store.runs.end_run(work, "r03", 1, RunEnd("completed", 5.0, None))
        store.runs.edit_run(work, "r05", {"name": "lr_100%", "tags": ["base", "sweep-1"]}, now=9.0)
        store.runs.edit_run(work, "r06", {"tags": ["sweep-10"]}, now=9.0)
        store.runs.edit_run(work, "r07", {"archived": True}, now=9.0)
    page = store.runs.find_runs(RunFilter(), limit=5)
    assert page["total"] == 11  # the archived one is hidden
    assert [r["id"] for r in page["runs"]] == ["r11", "r10", "r09", "r08", "r06"]
    second = store.runs.find_runs(RunFilter(), limit=5, offset=5)
    assert [r["id"] for r in second["runs"]] == ["r05", "r04", "r03", "r02", "r01"]
    # The name is searched as text: % and _ are not wildcards.
    assert [r["id"] for r in store.runs.find_runs(RunFilter(q="LR_100%"))["runs"]] == ["r05"]
    assert store.runs.find_runs(RunFilter(q="lr_1000"))["total"] == 0
    assert [r["id"] for r in store.runs.find_runs(RunFilter(tag="sweep-1"))["runs"]] == ["r05"]
    finished = store.runs.find_runs(RunFilter(status=("finished",)))["runs"]
    assert [r["id"] for r in finished] == ["r03"]
    archived = store.runs.find_runs(RunFilter(archived="only"))["runs"]
    assert [(r["id"], r["archived"]) for r in archived] == [("r07", True)]
    assert store.runs.find_runs(RunFilter(archived="include"))["total"] == 12
    by_name = store.runs.find_runs(RunFilter(sort="name", descending=False), limit=2)["runs"]
    assert [r["name"] for r in by_name] == ["lr_100%", "name-r00"]
    # Both engines alike: a name filter lowers every letter (SQLite's lower() did ASCII only),
    # a tag filter tells case apart (SQLite's LIKE did not).
    with store.transaction() as work:
        store.runs.edit_run(work, "r06", {"name": "Ärger-Test"}, now=9.0)
    for q in ("Ärger", "ärger", "ÄRGER-t"):
        assert [r["id"] for r in store.runs.find_runs(RunFilter(q=q))["runs"]] == ["r06"], q
    assert store.runs.find_runs(RunFilter(tag="SWEEP-1"))["total"] == 0
    with store.transaction() as work:
        store.alerts.save_alert(work, alert_row("a1", "r02"))  # critical, firing
        store.alerts.save_alert(work, {**alert_row("a2", "r04"), "severity": "warning",
                                       "state": "resolved"})  # fmt: skip
        store.alerts.save_alert(work, {**alert_row("a3", "r02"), "severity": "warning"})
        store.alerts.save_alert(work, {**alert_row("a4", "r08"), "severity": "info"})
    health = {h: [r["id"] for r in store.runs.find_runs(RunFilter(health=h))["runs"]]
              for h in ("critical", "warning")}  # fmt: skip
    assert health == {"critical": ["r02"], "warning": ["r04"]}
    assert store.runs.find_runs(RunFilter(health="healthy"))["total"] == 9  # info is healthy
    tagged = store.runs.find_runs(RunFilter(q="lr"), config_keys=("lr", "missing"))["runs"][0]
    assert tagged["tags"] == ["base", "sweep-1"] and tagged["config"] == {"lr": 0.1}


def test_a_renamed_run_renames_its_alerts_and_a_deleted_run_leaves_nothing(store: Store) -> None:
    with store.transaction() as work:
        store.runs.open_run(work, hello("gone"), now=1.0)
        store.runs.open_run(work, hello("kept"), now=1.0)
        for run_id in ("gone", "kept"):
            store.series.add_points(work, run_id, 1, {"loss": Columns([1], [1.0], [0.5])}, now=2)
            store.alerts.save_alert(work, alert_row(f"a-{run_id}", run_id))
            store.runs.add_event(work, run_id, 2, "nonfinite", 1, 2.0, {"loss": 1})
            silence = Silence(id=f"s-{run_id}", run_id=run_id, rule="nonfinite", subject="",
                              until=9e9, created_at=2.0, created_by=None)  # fmt: skip
            store.alerts.add_silence(work, silence)
        summary = store.runs.edit_run(
            work, "gone", {"name": "renamed", "notes": "lr too high"}, now=9.0
        )
        assert summary is not None and summary["notes"] == "lr too high"
    renamed = store.alerts.get_alert("a-gone")
    assert renamed is not None and renamed["run_name"] == "renamed"
    with store.transaction() as work:
        assert store.delete_run(work, "gone")
        assert not store.delete_run(work, "gone")
        assert store.runs.edit_run(work, "gone", {"name": "x"}, now=9.0) is None
    assert store.runs.get_run("gone") is None
    assert store.series.read_series("gone", "loss").steps.size == 0
    assert store.alerts.get_alert("a-gone") is None and store.runs.run_events("gone") == []
    assert [s["run_id"] for s in store.alerts.active_silences(now=3.0)] == ["kept"]
    kept = store.runs.get_run("kept")
    assert kept is not None and kept["series"] == ["loss"] and store.alerts.get_alert("a-kept")


def test_a_transactions_frames_leave_each_run_as_written_one_by_one(store: Store) -> None:
    """The frames' updates of the runs' rows go at once as the transaction commits (or before
    its next statement), merged run by run: what each row ends up as must be what one update
    a frame, in order, left; a rolled-back transaction's updates are not kept for the next."""
    with store.transaction() as work:
        for run_id in ("r1", "r2"):
            store.runs.open_run(work, hello(run_id), now=1.0)
    with store.transaction() as work:
        add = store.series.add_points
        add(work, "r1", 2, {"loss": Columns([3, 4], [3.0, 4.0], [0.5, 0.4])}, now=5.0)
        add(work, "r1", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.7, 0.6])}, now=6.0)  # resent
        add(work, "r1", 3, {"host/rss": Columns([4], [6.5], [1e9])}, now=7.0)
        add(work, "r2", 1, {}, now=8.0)
    rows = {r["id"]: r for r in store.runs.list_runs()}
    r1, r2 = rows["r1"], rows["r2"]
    assert (r1["last_step"], r1["last_seen"], r1["status"]) == (4, 7.0, "running")
    assert (r2["last_step"], r2["last_seen"]) == (None, 8.0)
    with store.engine.connect() as conn:
        seqs = dict(conn.execute(select(runs.c.id, runs.c.last_seq)).all())
    assert seqs == {"r1": 3, "r2": 1}

    try:
        with store.transaction() as work:
            store.series.add_points(work, "r1", 4, {"loss": Columns([9], [9.0], [0.1])}, now=10.0)
            raise RuntimeError("the transaction fails")
    except RuntimeError:
        pass
    with store.transaction() as work:
        store.series.add_points(work, "r2", 2, {"loss": Columns([1], [11.0], [0.2])}, now=11.0)
    rows = {r["id"]: r for r in store.runs.list_runs()}
    assert (rows["r1"]["last_step"], rows["r2"]["last_step"]) == (4, 1)


def test_each_series_is_summarised_as_its_frames_are_stored_and_runs_sort_by_it(
    store: Store,
) -> None:
    """A series' last value (at its highest step), least and greatest finite values, kept
    across frames and transactions and frames out of step order; a NaN last value
    named; runs sorted by any of them, those without the series last either way."""
    nan, inf = float("nan"), float("inf")
    with store.transaction() as work:
        for i, run_id in enumerate(("a", "b", "c", "d")):
            store.runs.open_run(work, hello(run_id, started_at=float(i)), now=1.0)
        # a: two frames in one transaction (merged before they are written), then more.
        store.series.add_points(
            work, "a", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.9, 0.7])}, now=2
        )
        store.series.add_points(
            work, "a", 2, {"loss": Columns([3, 3], [3.0, 3.1], [inf, 0.5])}, now=2
        )
        store.series.add_points(
            work, "b", 1, {"loss": Columns([1, 2], [1.0, 2.0], [0.2, 0.4])}, now=2
        )
        store.series.add_points(work, "c", 1, {"loss": Columns([5], [5.0], [nan])}, now=2)
        store.series.add_points(work, "d", 1, {"acc": Columns([5], [5.0], [0.8])}, now=2)
    with store.transaction() as work:
        # A frame whose steps are older than the stored last (a worker's late frame) keeps it.
        store.series.add_points(work, "a", 3, {"loss": Columns([2], [4.0], [0.05])}, now=3)
        store.series.add_points(
            work, "b", 2, {"loss": Columns([3, 4], [3.0, 4.0], [0.3, 0.35])}, now=3
        )
    page = store.runs.find_runs(
        RunFilter(sort="started_at", descending=False), metrics=("loss", "x")
    )
    metrics = {run["id"]: run["metrics"] for run in page["runs"]}
    assert metrics == {
        "a": {"loss": {"step": 3, "last": 0.5, "min": 0.05, "max": 0.9}},
        "b": {"loss": {"step": 4, "last": 0.35, "min": 0.2, "max": 0.4}},
        "c": {"loss": {"step": 5, "last": None, "min": None, "max": None, "nonfinite": "nan"}},
        "d": {},
    }
    assert "metrics" not in store.runs.find_runs(RunFilter())["runs"][0]

    def order(sort: str, descending: bool) -> list[str]:
        found = store.runs.find_runs(RunFilter(sort=sort, descending=descending))
        return [run["id"] for run in found["runs"]]

    assert order("last:loss", False) == ["b", "a", "d", "c"]  # d has none; c's is NaN
    assert order("last:loss", True) == ["a", "b", "d", "c"]
    assert order("min:loss", False) == ["a", "b", "d", "c"]
    assert order("max:loss", True) == ["a", "b", "d", "c"]
    assert order("max:acc", True)[0] == "d"
    assert store.runs.find_runs(RunFilter(sort="min:loss"), limit=1, offset=1)["total"] == 4
    # Points at the same highest step: the last sent is the last value, in one transaction
    # (merged before the write) and across two (merged by the upsert).
    with store.transaction() as work:
        store.series.add_points(work, "d", 2, {"acc": Columns([5], [6.0], [0.81])}, now=4)
        store.series.add_points(work, "d", 3, {"acc": Columns([5], [7.0], [0.82])}, now=4)
    last = store.runs.find_runs(RunFilter(q="-d"), metrics=("acc",))["runs"][0]["metrics"]
    assert last == {"acc": {"step": 5, "last": 0.82, "min": 0.8, "max": 0.82}}
    with store.transaction() as work:
        store.series.add_points(work, "d", 4, {"acc": Columns([5], [8.0], [0.79])}, now=5)
    last = store.runs.find_runs(RunFilter(q="-d"), metrics=("acc",))["runs"][0]["metrics"]
    assert last == {"acc": {"step": 5, "last": 0.79, "min": 0.79, "max": 0.82}}


def test_a_run_deleted_in_the_writers_transaction_keeps_none_of_its_frames(store: Store) -> None:
    """Frames of a run held for the commit, and any after its deletion in the same
    transaction (an agent still streaming it), leave no rows behind; other runs keep theirs."""
    loss = {"loss": Columns([1], [1.0], [0.5])}
    with store.transaction() as work:
        for run_id in ("gone", "kept"):
            store.runs.open_run(work, hello(run_id), now=1.0)
    with store.transaction() as work:
        store.series.add_points(work, "gone", 1, loss, now=2.0)
        store.series.add_points(work, "kept", 1, loss, now=2.0)
        assert store.delete_run(work, "gone")
        assert store.series.add_points(work, "gone", 2, loss, now=3.0) is None
    with store.engine.connect() as conn:
        for table in ("series", "chunks"):
            left = conn.execute(text(f"SELECT DISTINCT run_id FROM {table}")).scalars().all()
            assert left == ["kept"], table
    with store.transaction() as work:  # the next transaction forgets the deletion
        store.runs.open_run(work, hello("gone"), now=4.0)
        assert store.series.add_points(work, "gone", 1, loss, now=5.0) == 1
