"""The compactor's sweep (#20): ended runs compacted, and runs past their project's retention
thinned to a min/max summary that keeps spikes and NaN; on SQLite and PostgreSQL."""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest

from tests.server.storage.rows import hello
from trainvitals.protocol import Columns
from trainvitals.server.compactor import Compactor
from trainvitals.server.settings import Retention, Settings
from trainvitals.server.storage.runs import RunEnd
from trainvitals.server.store import Store

DAY = 86400.0
ENDED = 1_000_000.0


def ended_run(store: Store, run_id: str, project: str, points: int = 20_000) -> np.ndarray:
    values = np.sin(np.arange(points) / 500.0)
    values[7_000] = 40.0  # a one-step spike
    values[12_345] = math.nan
    with store.engine.begin() as conn:
        store.runs.open_run(conn, {**hello(run_id), "project": project}, now=1.0)
        for seq, start in enumerate(range(0, points, 100), start=1):
            part = slice(start, start + 100)
            steps = np.arange(points)[part]
            columns = Columns(steps, ENDED - points + steps * 1.0, values[part])
            store.series.add_points(conn, run_id, seq, {"loss": columns}, now=2.0)
        store.runs.end_run(conn, run_id, points // 100 + 1, RunEnd("completed", ENDED, None))
    return values


def test_runs_are_thinned_after_their_projects_days_keeping_spikes(store: Store) -> None:
    kept = ended_run(store, "kept", "p")
    scratch = ended_run(store, "scratch", "scratch")
    now = [ENDED + 2 * DAY]
    compactor = Compactor(
        store.series, 0, Retention.parse("30,scratch=1,golden=0"), 200, clock=lambda: now[0]
    )
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
        from sqlalchemy import select

        from trainvitals.server.storage.schema import runs

        thinned = dict(conn.execute(select(runs.c.id, runs.c.thinned_at)).all())
    assert thinned == {"kept": ENDED + 31 * DAY, "scratch": ENDED + 2 * DAY}


def test_a_live_run_and_a_project_kept_forever_are_never_thinned(store: Store) -> None:
    ended_run(store, "golden", "golden")
    with store.engine.begin() as conn:
        store.runs.open_run(conn, hello("live"), now=1.0)
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
