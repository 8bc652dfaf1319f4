"""What a run is read and written as: its summary, its row, a page of the runs list, an edit,
its job and events (:mod:`~trainvitals.server.storage.runs` reads and writes them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import (
    Any,
    NotRequired,  # pydantic reads these on 3.11
    cast,
)

from typing_extensions import TypedDict


class RunSummary(TypedDict):
    """A run as the run list and browsers see it."""

    id: str
    project: str
    name: str
    status: str  # a RunStatus value
    started_at: float
    ended_at: float | None
    last_step: int | None
    last_seen: float
    host: str
    pid: int
    end_reason: str | None
    job_id: str | None
    worker: str | None
    #: The training process that made it: the runs of one loop of fits share it.
    process_key: str | None
    tags: list[str]
    notes: str
    archived: bool


class MetricSummary(TypedDict):
    """A series of a run at a glance: ``last``, its value at ``step``, its highest step (null
    when NaN or ±Inf, which ``nonfinite`` then names: ``nan``, ``inf``, ``-inf``); ``min`` and
    ``max``, its least and greatest finite values (null when it has none)."""

    step: int
    last: float | None
    min: float | None
    max: float | None
    nonfinite: NotRequired[str]


class ListedRun(RunSummary):
    """A run in the runs list: its summary, and the config values and series asked for."""

    config: NotRequired[dict[str, Any]]
    metrics: NotRequired[dict[str, MetricSummary]]


class RunPage(TypedDict):
    """One page of the runs list and how many runs match in all."""

    runs: list[ListedRun]
    total: int


class RunEdit(TypedDict, total=False):
    """What people may change of a run (``PATCH /api/v1/runs/{id}``)."""

    name: str
    tags: list[str]
    notes: str
    archived: bool


class RunEnding(RunSummary):
    """How the run ended or stalled, and the key of its job."""

    traceback: str | None
    stalled_at: float | None
    stall_stacks: str | None
    job_key: str | None


class RunRow(RunEnding):
    """One row of the ``runs`` table."""

    last_seq: int  # the last agent frame stored
    config: str  # JSON
    env: str  # JSON


class OpenedRun(RunRow):
    """The row of a run that said hello."""

    created: bool  # a new run (else one reconnecting)
    #: False when the hello did not prove the run's secret: nothing was changed.
    owned: bool
    #: A secret issued now (to a new run, or an older one that had none), for the welcome.
    secret: str | None


class JobMember(TypedDict):
    """One run of a job."""

    id: str
    name: str
    worker: str | None
    status: str
    started_at: float
    last_step: int | None
    last_seen: float
    host: str


class Job(TypedDict):
    """A job of several processes: its runs, in worker order (chief first)."""

    id: str
    runs: list[JobMember]


class RunDetail(RunEnding):
    """One run with everything the API tells of it."""

    config: dict[str, Any]
    env: dict[str, Any]
    series: list[str]  # the names of its series
    #: Each of its series' summary, by name (those with a point).
    metrics: dict[str, MetricSummary]
    job: NotRequired[Job]


class RunEvent(TypedDict):
    """A kept agent frame (an autopsy)."""

    kind: str
    step: int
    time: float
    data: dict[str, Any]


@dataclass(frozen=True)
class RunEnd:
    """How a run ended; its status follows from the reason
    (:mod:`trainvitals.server.run_lifecycle`)."""

    reason: str
    ended_at: float
    traceback: str | None


def worker_order(worker: str | None) -> tuple[int, str, int, str]:
    """Sort key of worker names: ``chief`` and ``master`` first, then by type, then by
    index (``worker:2`` before ``worker:10``)."""
    kind, _, index = (worker or "").rpartition(":")
    if not kind:
        kind, index = index, ""
    number = int(index) if index.isdigit() else -1
    return (0 if kind in ("chief", "master") else 1, kind, number, worker or "")


def run_summary(run: Mapping[str, Any]) -> RunSummary:
    """The summary of a run row (its tags decoded; rows from before them have none)."""
    summary = {field: run.get(field) for field in RunSummary.__annotations__}
    summary["tags"] = json.loads(run.get("tags") or "[]")
    summary["notes"] = run.get("notes") or ""
    summary["archived"] = bool(run.get("archived"))
    return cast(RunSummary, summary)
