"""Which runs a query reads: the runs list's filter and sort (:class:`RunFilter`), the series
summaries it shows, a job's runs, and the runs retention has reached."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, and_, false, func, or_, select, true
from sqlalchemy.sql.elements import ColumnElement

from trainvitals.server.run_lifecycle import ALIVE
from trainvitals.server.settings import Retention
from trainvitals.server.storage.run_moves import status_values
from trainvitals.server.storage.run_rows import Job, JobMember, MetricSummary, worker_order
from trainvitals.server.storage.schema import alerts, runs, series

#: Seconds in a day (retention is set in days).
DAY = 86400.0
#: The runs list's sort keys (``GET /api/v1/runs?sort=``), besides a series' statistic.
SORTS = ("started_at", "name", "project", "status", "last_step", "last_seen", "host", "ended_at")
#: A series' statistics the runs list sorts by (``sort=min:val_loss``), and their columns.
METRIC_STATS = {"last": "last_value", "min": "min_value", "max": "max_value"}


@dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows, in what order.

    Attributes:
        project: only that project's runs; job: only that job's workers; process: only the
            runs that process made.
        q: part of the name (case-insensitive); status: one of them; tag: runs with that tag.
        archived: ``hide`` (the default), ``only`` or ``include`` the archived runs.
        health: the worst alert the run raised, firing or not: ``critical``, ``warning``, or
            ``healthy`` (no warning or critical alert).
        sort: one of :data:`SORTS`, or a series' statistic, ``last:NAME``, ``min:NAME`` or
            ``max:NAME`` (see :data:`METRIC_STATS`; runs without that series, or without a
            finite value of it, come last either way); descending: its order.
    """

    project: str | None = None
    job: str | None = None
    process: str | None = None
    q: str | None = None
    status: tuple[str, ...] = ()
    tag: str | None = None
    archived: str = "hide"
    health: str | None = None
    sort: str = "started_at"
    descending: bool = True


def filter_conditions(which: RunFilter) -> list[ColumnElement[bool]]:
    """The WHERE clauses of a :class:`RunFilter`."""
    where: list[ColumnElement[bool]] = []
    if which.project is not None:
        where.append(runs.c.project == which.project)
    if which.job is not None:
        where.append(runs.c.job_id == which.job)
    if which.process is not None:
        where.append(runs.c.process_key == which.process)
    if which.q:
        where.append(func.lower(runs.c.name).contains(which.q.lower(), autoescape=True))
    if which.status:
        where.append(runs.c.status.in_(which.status))
    if which.tag:
        # Tags are stored as a JSON list of strings that hold no quote or backslash.
        where.append(runs.c.tags.contains(json.dumps(which.tag), autoescape=True))
    if which.health is not None:
        where.append(_raised(which.health))
    archived = func.coalesce(runs.c.archived, false())
    if which.archived == "hide":
        where.append(archived == false())
    elif which.archived == "only":
        where.append(archived == true())
    return where


def _raised(health: str) -> ColumnElement[bool]:
    """Runs whose worst alert, firing or not, is ``health`` (``healthy``: no warning or
    critical alert)."""

    def any_of(*severities: str) -> ColumnElement[bool]:
        return (
            select(alerts.c.id)
            .where(alerts.c.run_id == runs.c.id, alerts.c.severity.in_(severities))
            .exists()
        )

    if health == "critical":
        return any_of("critical")
    if health == "warning":
        return and_(any_of("warning"), ~any_of("critical"))
    return ~any_of("warning", "critical")


def metric_summaries(
    conn: Connection, run_ids: list[str], names: tuple[str, ...] | None = None
) -> dict[str, dict[str, MetricSummary]]:
    """Run id -> series name -> its summary, of those of ``names`` (all when None) each run
    has points of."""
    if not run_ids or names == ():
        return {}
    query = select(
        series.c.run_id,
        series.c.name,
        series.c.last_step,
        series.c.last_value,
        series.c.last_nonfinite,
        series.c.min_value,
        series.c.max_value,
    ).where(series.c.run_id.in_(run_ids), series.c.last_step.is_not(None))
    if names is not None:
        query = query.where(series.c.name.in_(names))
    found: dict[str, dict[str, MetricSummary]] = {}
    for run_id, name, step, last, nonfinite, low, high in conn.execute(query):
        summary = MetricSummary(step=step, last=last, min=low, max=high)
        if nonfinite is not None:
            summary["nonfinite"] = nonfinite
        found.setdefault(run_id, {})[name] = summary
    return found


def read_job(conn: Connection, job_id: str) -> Job:
    """A job and its runs, in worker order (chief first, then by type and index)."""
    members = [
        cast(JobMember, dict(r))
        for r in conn.execute(
            select(*(runs.c[f] for f in JobMember.__annotations__)).where(runs.c.job_id == job_id)
        ).mappings()
    ]
    members.sort(key=lambda m: worker_order(m["worker"]))
    return Job(id=job_id, runs=members)


def past_days(
    after_days: Retention, column: ColumnElement[Any], now: float
) -> ColumnElement[bool] | None:
    """Whether ``column`` (a time) lies further back than the run's project's days in
    ``after_days``, as SQL; None when the policy reaches no project."""
    old = [
        and_(runs.c.project == project, column < now - days * DAY)
        for project, days in after_days.projects.items()
        if days > 0
    ]
    if after_days.default is not None:
        others = runs.c.project.not_in(list(after_days.projects))
        old.append(and_(others, column < now - after_days.default * DAY))
    return or_(*old) if old else None


def archived_past(now: float, after_days: Retention) -> ColumnElement[bool] | None:
    """Runs that have ended, archived longer ago than their project's days, as SQL (None:
    none can be). A running run is never among them: its agent would write it again."""
    old = past_days(after_days, runs.c.archived_at, now)
    if old is None:
        return None
    return and_(
        runs.c.archived == true(),
        runs.c.archived_at.is_not(None),
        runs.c.status.not_in(status_values(ALIVE)),
        old,
    )
