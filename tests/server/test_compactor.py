"""The compactor's sweep (#20): ended runs compacted, runs past their project's retention
thinned to a min/max summary that keeps spikes and NaN, and archived runs past their project's
days deleted, under a lease, with browsers told; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator

import numpy as np
import pydantic
import pytest
from sqlalchemy import func, select

from tests.server.storage.rows import alert_row, hello
from trainvitals.protocol import Columns
from trainvitals.server.compactor import Compactor
from trainvitals.server.leases import RETENTION, RUN, Leases
from trainvitals.server.live import Hub
from trainvitals.server.settings import Retention, Settings
from trainvitals.server.storage import RunEnd
from trainvitals.server.storage.schema import chunks, events, leases, runs
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer

DAY = 86400.0
ENDED = 1_000_000.0


@pytest.fixture
def writer(store: Store) -> Iterator[Writer]:
    writer = Writer(store)
    yield writer
    writer.close()


def ended_run(store: Store, run_id: str, project: str, points: int = 20_000) -> np.ndarray:
    values = np.sin(np.arange(points) / 500.0)
    values[7_000] = 40.0  # a one-step spike
    values[12_345] = math.nan
    with store.transaction() as work:
        store.runs.open_run(work, {**hello(run_id), "project": project}, now=1.0)
        for seq, start in enumerate(range(0, points, 100), start=1):
            part = slice(start, start + 100)
            steps = np.arange(points)[part]
            columns = Columns(steps, ENDED - points + steps * 1.0, values[part])
            store.series.add_points(work, run_id, seq, {"loss": columns}, now=2.0)
        store.runs.end_run(work, run_id, points // 100 + 1, RunEnd("completed", ENDED, None))
    return values


def test_runs_are_thinned_after_their_projects_days_keeping_spikes(
    store: Store, writer: Writer
) -> None:
    kept = ended_run(store, "kept", "p")
    scratch = ended_run(store, "scratch", "scratch")
    now = [ENDED + 2 * DAY]
    compactor = Compactor(
        store, writer, Hub(), 0, thin_after=Retention.parse("30,scratch=1,golden=0"),
        thin_points=200, clock=lambda: now[0],
    )  # fmt: skip
    compactor.sweep()
    steps, _, values = store.series.read_series("scratch", "loss")
    assert 100 <= values.size <= 200 and np.all(np.diff(steps) > 0)
    assert 40.0 in values and np.isnan(values).sum() == 1
    assert values[np.isfinite(values)].min() == scratch[np.isfinite(scratch)].min()
    # Not yet 30 days: every point, compacted.
    assert store.series.read_series("kept", "loss").values.tobytes() == kept.tobytes()
    assert store.series.runs_to_compact(0, 1) == []

    now[0] = ENDED + 31 * DAY
    assert store.series.runs_to_thin(now[0], Retention.parse("30,scratch=1")) == ["kept"]
    compactor.sweep()
    assert store.series.read_series("kept", "loss").values.size <= 200
    assert store.series.runs_to_thin(now[0], Retention.parse("30,scratch=1")) == []
    with store.engine.connect() as conn:
        thinned = dict(conn.execute(select(runs.c.id, runs.c.thinned_at)).all())
    assert thinned == {"kept": ENDED + 31 * DAY, "scratch": ENDED + 2 * DAY}


def test_a_live_run_and_a_project_kept_forever_are_never_thinned(store: Store) -> None:
    ended_run(store, "golden", "golden")
    with store.transaction() as work:
        store.runs.open_run(work, hello("live"), now=1.0)
    policy = Retention.parse("1,golden=0")
    assert store.series.runs_to_thin(ENDED + 400 * DAY, policy) == []
    assert store.series.runs_to_thin(ENDED + 400 * DAY, Retention()) == []


def test_the_retention_setting_is_read_and_a_bad_one_named() -> None:
    assert Settings(thin_after_days="90, scratch=7,golden=0").retention == Retention(
        90.0, {"scratch": 7.0, "golden": 0.0}
    )
    assert Settings().retention == Retention(None, {})
    with pytest.raises(pydantic.ValidationError, match=r"(?s)thin_after_days.*but got 'p=-3'"):
        Settings(thin_after_days="30,p=-3")


def archived_run(store: Store, run_id: str, project: str, archived: float | None) -> None:
    """An ended run with a point, an alert, an event and its detector's lease, archived at
    ``archived`` (None: never)."""
    with store.transaction() as work:
        store.runs.open_run(work, {**hello(run_id), "project": project}, now=1.0)
        store.series.add_points(work, run_id, 1, {"loss": Columns([1], [1.0], [0.5])}, now=2.0)
        store.alerts.save_alert(work, {**alert_row(f"a-{run_id}", run_id), "project": project})
        store.runs.add_event(work, run_id, 2, "nonfinite", 1, 2.0, {"loss": 1})
        store.leases.take(work, RUN + run_id, "someone", until=9e9)
        store.runs.end_run(work, run_id, 3, RunEnd("completed", 3.0, None))
        if archived is not None:
            store.runs.edit_run(work, run_id, {"archived": True}, now=archived)


def left_of(store: Store) -> dict[str, int]:
    """Rows of each table that belong to a run, over every run."""
    with store.engine.connect() as conn:
        counts = {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                  for t in (chunks, events)}  # fmt: skip
        counts["alerts"] = len(store.alerts.list_alerts())
        of_runs = select(func.count()).where(leases.c.name.startswith(RUN))
        counts["leases"] = conn.execute(of_runs).scalar_one()
    return counts


def test_archived_runs_are_deleted_after_their_projects_days_by_one_replica(
    store: Store, writer: Writer
) -> None:
    archived_run(store, "old", "p", archived=ENDED)
    archived_run(store, "fresh", "p", archived=ENDED + 9 * DAY)
    archived_run(store, "back", "p", archived=ENDED)
    archived_run(store, "golden", "golden", archived=ENDED)  # 0: never
    archived_run(store, "elsewhere", "other", archived=ENDED)  # no policy for its project
    archived_run(store, "listed", "p", archived=None)
    with store.transaction() as work:
        store.runs.open_run(work, {**hello("live"), "project": "p"}, now=1.0)
        store.runs.edit_run(work, "live", {"archived": True}, now=ENDED)  # running: kept
        store.runs.edit_run(work, "back", {"archived": False}, now=ENDED + DAY)
        # Archiving it again keeps the first time.
        store.runs.edit_run(work, "old", {"archived": True}, now=ENDED + 10.5 * DAY)
    before = left_of(store)
    policy = Retention.parse("p=10,golden=0")
    now = [ENDED + 11 * DAY]

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        hub = Hub()
        browser = hub.subscribe("p")
        one, two = (Leases(store.leases, writer, ttl=15.0) for _ in range(2))
        other, this = (
            Compactor(store, writer, hub, 0, delete_archived_after=policy, leases=leases,
                      clock=lambda: now[0])
            for leases in (one, two)
        )  # fmt: skip
        assert await one.claim(RETENTION)
        kept_by_lease = await this.delete_archived()  # another replica deletes
        await one.release(RETENTION)
        deleted = await this.delete_archived()
        assert await other.delete_archived() == []  # the lease is held by `this` now
        await two.release(RETENTION)
        again = await other.delete_archived()
        told = []
        while not browser.queue.empty():
            told.append(json.loads(browser.queue.get_nowait()))
        assert told == [{"type": "deleted", "run_id": "old", "project": "p"}]
        return kept_by_lease, deleted, again

    kept_by_lease, deleted, again = asyncio.run(scenario())
    assert (kept_by_lease, deleted, again) == ([], ["old"], [])
    assert store.runs.get_run("old") is None
    assert store.series.read_series("old", "loss").steps.size == 0
    assert store.alerts.get_alert("a-old") is None and store.runs.run_events("old") == []
    after = left_of(store)
    # One run's chunk, event, alert and lease gone; the rest's kept.
    assert {k: before[k] - after[k] for k in before} == {k: 1 for k in before}
    with store.engine.connect() as conn:
        kept = dict(conn.execute(select(runs.c.id, runs.c.archived_at)).all())
    assert kept == {"fresh": ENDED + 9 * DAY, "back": None, "golden": ENDED,
                    "elsewhere": ENDED, "listed": None, "live": ENDED}  # fmt: skip
    assert store.runs.archived_to_delete(ENDED + 400 * DAY, Retention()) == []
    assert store.runs.archived_to_delete(ENDED + 20 * DAY, policy) == ["fresh"]


def test_an_archived_run_brought_back_before_its_deletion_is_kept(store: Store) -> None:
    archived_run(store, "r", "p", archived=ENDED)
    policy = Retention.parse("1")
    assert store.runs.archived_to_delete(ENDED + 2 * DAY, policy) == ["r"]
    with store.transaction() as work:  # unarchived between the listing and the deletion
        store.runs.edit_run(work, "r", {"archived": False}, now=ENDED + DAY)
        assert store.delete_archived(work, "r", ENDED + 2 * DAY, policy) is None
        store.runs.edit_run(work, "r", {"archived": True}, now=ENDED + 1.5 * DAY)
        assert store.delete_archived(work, "r", ENDED + 2 * DAY, policy) is None
        assert store.delete_archived(work, "r", ENDED + 2.6 * DAY, policy) == "p"
    assert store.runs.get_run("r") is None


def test_the_archived_retention_setting_is_read_and_a_bad_one_named() -> None:
    settings = Settings(delete_archived_after_days="30,golden=0")
    assert settings.archived_retention == Retention(30.0, {"golden": 0.0})
    assert not Retention.parse("golden=0").applies and Retention.parse("p=1").applies
    with pytest.raises(pydantic.ValidationError, match=r"(?s)delete_archived_after_days.*'x'"):
        Settings(delete_archived_after_days="x")
