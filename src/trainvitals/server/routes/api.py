"""``/api/v1`` REST routes: runs, series, alerts."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Annotated, Any, Literal, cast

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from trainvitals.detect import AlertState, Severity
from trainvitals.protocol import UNSAFE_CHARS, ArrayColumns, Columns, RunStatus
from trainvitals.series import HOST_PREFIX
from trainvitals.server.answers import (
    API_ERRORS,
    AlertsAnswer,
    DeletedAnswer,
    ListedRun,
    ProjectsAnswer,
    RulesAnswer,
    RunAnswer,
    RunsAnswer,
    SeriesAnswer,
    SeriesPoints,
    SilenceAnswer,
)
from trainvitals.server.auth import (
    LOCAL,
    Admin,
    NoProject,
    Reader,
    alert_for,
    check_project,
    scoped,
)
from trainvitals.server.deps import (
    AlertsDep,
    StateDep,
    StoreDep,
    alert_not_found,
    get_state,
    run_not_found,
)
from trainvitals.server.downsample import downsample_indices
from trainvitals.server.errors import StrictJSONRoute
from trainvitals.server.export import (
    MEDIA_TYPES,
    PARQUET_HINT,
    RUN_SERIES,
    SERIES,
    Batches,
    ExportFormat,
    export,
    parquet_available,
)
from trainvitals.server.live import finite_or_none
from trainvitals.server.run_lifecycle import ALIVE
from trainvitals.server.schemas import SeriesName
from trainvitals.server.storage import AlertRow, RunEdit, RunFilter, RunSummary
from trainvitals.server.storage.run_queries import METRIC_STATS, SORTS
from trainvitals.server.storage.tokens import Principal, Role
from trainvitals.server.store import Store

router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)

MAX_POINTS_LIMIT = 100_000
#: Steps are exact in a browser up to 2^53, and ingest refuses larger ones.
STEP_BOUND = 2**53
#: Series one request may read: a run with thousands of series must not hold a worker.
MAX_SERIES_PER_REQUEST = 200
#: Runs one export may hold (the dashboard compares at most 10).
MAX_RUNS_PER_EXPORT = 50


#: A runs list's sort key: a run's field, or a series' statistic (``min:val_loss``).
SortParam = Annotated[
    str,
    Query(
        max_length=300,
        pattern=rf"^({'|'.join(SORTS)}|({'|'.join(METRIC_STATS)}):[^\x00-\x1f\x7f]{{1,256}})$",
        description="a run's field, or a series' statistic: last:NAME, min:NAME or max:NAME",
    ),
]
ArchivedParam = Literal["hide", "only", "include"]
#: Config values one list request may add to each run.
MAX_CONFIG_KEYS = 20
#: Series summaries one list request may add to each run.
MAX_METRICS = 20


@router.get("/runs")
def list_runs(
    store: StoreDep,
    who: Reader,
    response: Response,
    project: str | None = None,
    job: str | None = None,
    process: Annotated[str | None, Query(max_length=128)] = None,
    q: Annotated[str | None, Query(max_length=200)] = None,
    status: Annotated[list[RunStatus] | None, Query(max_length=5)] = None,
    tag: Annotated[str | None, Query(max_length=64)] = None,
    archived: ArchivedParam = "hide",
    health: Literal["critical", "warning", "healthy"] | None = None,
    sort: SortParam = "started_at",
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    config: Annotated[list[str] | None, Query(max_length=MAX_CONFIG_KEYS)] = None,
    metric: Annotated[list[SeriesName] | None, Query(max_length=MAX_METRICS)] = None,
) -> RunsAnswer:
    """A page of runs, newest first unless ``sort`` and ``order`` say otherwise, with the
    number of runs that match in ``total`` (and the ``X-Total-Count`` header). Filters:
    ``project``, ``job`` (its workers), ``process`` (the runs one process made: its
    ``process_key``), ``q`` (part of the name), ``status``, ``tag``, ``archived``, ``health``
    (the worst alert it raised, firing or not). Each run carries the ``config`` values and the
    summaries of the series (``metric``) asked for. A token of one project sees that
    project's runs only."""
    seen = scoped(who, project)
    if isinstance(seen, NoProject):
        response.headers["X-Total-Count"] = "0"
        return {"runs": [], "total": 0}
    which = RunFilter(
        project=seen,
        job=job,
        process=process,
        q=q or None,
        status=tuple(s.value for s in status or ()),
        tag=tag or None,
        archived=archived,
        health=health,
        sort=sort,
        descending=order == "desc",
    )
    page = store.runs.find_runs(which, limit, offset, tuple(config or ()), tuple(metric or ()))
    response.headers["X-Total-Count"] = str(page["total"])
    healths = store.alerts.health([run["id"] for run in page["runs"]])
    listed = [{**run, "health": healths[run["id"]]} for run in page["runs"]]
    return {"runs": cast(list[ListedRun], listed), "total": page["total"]}


@router.get("/projects")
def list_projects(store: StoreDep, who: Reader) -> ProjectsAnswer:
    """Every project that has a run, sorted (for a filter's choices); a token of one project
    sees that project only."""
    return {"projects": store.runs.projects(only=who.projects)}


@router.get("/runs/{run_id}")
def get_run(run_id: str, store: StoreDep, who: Reader) -> RunAnswer:
    """One run with its config, environment, series names and how it ended."""
    run = store.runs.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    # The detail row plus what this route adds (mypy can't follow ** into a TypedDict with
    # a key that is not required).
    out = cast(
        RunAnswer,
        {
            **run,
            "health": store.alerts.health([run_id])[run_id],
            "events": store.runs.run_events(run_id),
        },
    )
    if run["status"] not in ALIVE:  # evidence for the ending panel
        out["last_readings"] = store.series.last_values(run_id, (HOST_PREFIX, "gpu"))
    return out


#: Control characters a run's name, tags and notes may not hold (notes keep \t and \n).
_CONTROL = re.compile(rf"[{UNSAFE_CHARS}]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: The same rules as JSON-schema patterns: text with a visible character and no control
#: characters; a tag without quotes, backslashes or commas either; notes with tabs and lines.
VISIBLE = rf"^[^{UNSAFE_CHARS}]*[^\s{UNSAFE_CHARS}][^{UNSAFE_CHARS}]*$"
_TAG = rf'^[^{UNSAFE_CHARS}"\\,]*[^\s{UNSAFE_CHARS}"\\,][^{UNSAFE_CHARS}"\\,]*$'
_NOTES = r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$"


class RunEditRequest(BaseModel):
    """``PATCH /api/v1/runs/{id}``: the fields to change, each optional."""

    model_config = ConfigDict(extra="forbid")

    # The patterns say in the schema what the validators below check (they also trim).
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=VISIBLE)
    tags: list[Annotated[str, Field(min_length=1, max_length=64, pattern=_TAG)]] | None = Field(
        default=None, max_length=32
    )
    notes: str | None = Field(default=None, max_length=10_000, pattern=_NOTES)
    archived: StrictBool | None = None

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        if name is not None and (_CONTROL.search(name) or not name.strip()):
            raise ValueError("a run's name must be visible text without control characters")
        return name.strip() if name is not None else None

    @field_validator("tags")
    @classmethod
    def _plain_tags(cls, tags: list[str] | None) -> list[str] | None:
        if tags is None:
            return None
        kept: list[str] = []
        for tag in (t.strip() for t in tags):
            if not 1 <= len(tag) <= 64 or _CONTROL.search(tag) or set(tag) & set('"\\,'):
                raise ValueError(
                    f"a tag is 1-64 characters without control characters, quotes, "
                    f"backslashes or commas, but got {tag[:80]!r}"
                )
            if tag not in kept:
                kept.append(tag)
        return kept

    @field_validator("notes")
    @classmethod
    def _plain_notes(cls, notes: str | None) -> str | None:
        if notes is not None and _CONTROL_BUT_LINES.search(notes):
            raise ValueError("notes may hold tabs and line breaks but no other control characters")
        return notes


@router.patch("/runs/{run_id}")
async def edit_run(run_id: str, body: RunEditRequest, state: StateDep, who: Admin) -> RunSummary:
    """Rename, tag, note or archive a run (``admin`` on its project). Returns its summary."""
    run = await asyncio.to_thread(state.store.runs.get_run, run_id, job=False, metrics=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.ADMIN, run["project"], run_not_found(run_id))
    edit = cast(RunEdit, body.model_dump(exclude_none=True))
    summary = await state.writer.submit(
        partial(state.store.runs.edit_run, run_id=run_id, edit=edit, now=time.time())
    )
    if summary is None:
        raise run_not_found(run_id)
    state.hub.run_changed(summary, fresh=True)
    return summary


@router.delete("/runs/{run_id}")
async def delete_run(run_id: str, state: StateDep, who: Admin) -> DeletedAnswer:
    """Delete a run that has ended, with its points, alerts and notices (``admin`` on its
    project). A run still running or stalled is ``409``: its agent would write it again."""
    run = await asyncio.to_thread(state.store.runs.get_run, run_id, job=False, metrics=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.ADMIN, run["project"], run_not_found(run_id))
    if RunStatus(run["status"]) in ALIVE:
        raise HTTPException(
            409, f"run {run_id!r} is {run['status']}: stop it (or wait until it is lost) first"
        )
    if not await state.writer.submit(partial(state.store.delete_run, run_id=run_id)):
        raise run_not_found(run_id)
    state.hub.run_deleted(run_id, run["project"])
    return {"deleted": run_id}


@router.get("/runs/{run_id}/series")
def get_series(
    run_id: str,
    store: StoreDep,
    who: Reader,
    name: Annotated[list[str] | None, Query(max_length=MAX_SERIES_PER_REQUEST)] = None,
    max_points: Annotated[int, Query(ge=2, le=MAX_POINTS_LIMIT)] = 2000,
    min_step: Annotated[int | None, Query(ge=-STEP_BOUND, le=STEP_BOUND)] = None,
    max_step: Annotated[int | None, Query(ge=-STEP_BOUND, le=STEP_BOUND)] = None,
) -> SeriesAnswer:
    """Series of a run (all of them when no ``name`` is given), each downsampled to at most
    ``max_points`` with every bucket's min and max kept; ``min_step`` and ``max_step``
    (inclusive): only the points in that range, so a zoom gets full detail. NaN/Inf values
    come back as null; ``count`` is the points stored in the range (none when ``min_step``
    is above ``max_step``)."""
    run = store.runs.get_run(run_id, job=False, metrics=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    names = name if name else run["series"][:MAX_SERIES_PER_REQUEST]
    out: dict[str, SeriesPoints] = {}
    for series_name in names:
        steps, times, values = store.series.read_series(run_id, series_name)
        # Steps come sorted: the range is one slice.
        lo = 0 if min_step is None else int(np.searchsorted(steps, min_step, side="left"))
        hi = steps.size if max_step is None else int(np.searchsorted(steps, max_step, side="right"))
        steps, times, values = steps[lo:hi], times[lo:hi], values[lo:hi]
        keep = downsample_indices(values, max_points)
        out[series_name] = {
            "step": steps[keep].tolist(),
            "time": times[keep].tolist(),
            "value": finite_or_none(values[keep].tolist()),
            "count": int(values.size),
        }
    return {"series": out}


#: An export's file name (before its extension): plain ASCII, safe in a header as it is.
_FILENAME = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$"


class ExportQuery:
    """What both export routes take besides the runs: the series, the file's format, a step
    range and the file's name."""

    def __init__(
        self,
        request: Request,
        name: Annotated[list[str] | None, Query(max_length=MAX_SERIES_PER_REQUEST)] = None,
        fmt: Annotated[ExportFormat, Query(alias="format")] = ExportFormat.CSV,
        min_step: Annotated[int | None, Query(ge=-STEP_BOUND, le=STEP_BOUND)] = None,
        max_step: Annotated[int | None, Query(ge=-STEP_BOUND, le=STEP_BOUND)] = None,
        filename: Annotated[str | None, Query(pattern=_FILENAME)] = None,
    ) -> None:
        self.names = list(dict.fromkeys(name)) if name else None
        self.fmt, self.filename = fmt, filename
        self._steps = min_step, max_step
        self._slots = get_state(request).exports

    def points(self, store: Store, run_id: str, name: str) -> Iterator[ArrayColumns]:
        """The run's points of series ``name`` in the step range, a stored batch at a time."""
        for points in store.series.iter_series(run_id, name):
            yield _in_range(points, *self._steps)

    def answer(self, batches: Batches, labels: tuple[str, ...], filename: str) -> StreamingResponse:
        """The file, streamed (``501`` for Parquet on a server without pyarrow)."""
        if self.fmt is ExportFormat.PARQUET and not parquet_available():
            raise HTTPException(501, PARQUET_HINT)
        if not self._slots.acquire(blocking=False):
            raise HTTPException(
                503,
                "as many exports as this server runs at once are streaming: try again shortly",
                headers={"Retry-After": "5"},
            )
        disposition = f'attachment; filename="{self.filename or filename}.{self.fmt.value}"'
        return StreamingResponse(
            _releasing(export(self.fmt, batches, labels), self._slots),
            media_type=MEDIA_TYPES[self.fmt],
            headers={"Content-Disposition": disposition},
        )


ExportDep = Annotated[ExportQuery, Depends()]
#: The export routes' answer in the OpenAPI document: a file in one of the media types.
EXPORTED: dict[int | str, dict[str, Any]] = {
    200: {"content": {media: {} for media in MEDIA_TYPES.values()}}
}


@router.get("/runs/{run_id}/export", response_class=StreamingResponse, responses=EXPORTED)
def export_series(run_id: str, store: StoreDep, who: Reader, query: ExportDep) -> StreamingResponse:
    """Every point of the run's series (all of them when no ``name`` is given) at full
    resolution, streamed as CSV, JSON Lines or Parquet (see docs/contract.md#export);
    ``min_step`` and ``max_step`` (inclusive): only the points in that range; ``filename``:
    the file's name before its extension (the run's id by default)."""
    run = store.runs.get_run(run_id, job=False, metrics=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    names = query.names or run["series"]
    missing = sorted(set(names) - set(run["series"]))
    if missing:
        raise HTTPException(404, f"Run {run_id!r} has no series {missing[0]!r}")
    batches = (((n,), p) for n in names for p in query.points(store, run_id, n))
    return query.answer(batches, SERIES, run_id)


@router.get("/export", response_class=StreamingResponse, responses=EXPORTED)
def export_runs(
    store: StoreDep,
    who: Reader,
    query: ExportDep,
    run: Annotated[list[str], Query(min_length=1)],
) -> StreamingResponse:
    """Every point of several runs' series (``run`` repeated; every series of each when no
    ``name`` is given) at full resolution, streamed as one file with the run's id and name
    on each row (see docs/contract.md#export), run after run in the order asked; the other
    parameters as for one run's export. A series one run lacks is left out of that run;
    ``404`` when a run is unknown (or in a project the token cannot read) or when no run has
    one of the series asked for."""
    asked = list(dict.fromkeys(run))
    if len(asked) > MAX_RUNS_PER_EXPORT:
        raise RequestValidationError([{
            "type": "too_long", "loc": ("query", "run"), "input": None,
            "msg": f"at most {MAX_RUNS_PER_EXPORT} distinct runs, got {len(asked)}",
        }])  # fmt: skip
    runs = []
    for run_id in asked:
        found = store.runs.get_run(run_id, job=False, metrics=False)
        if found is None:
            raise run_not_found(run_id)
        check_project(who, Role.READ, found["project"], run_not_found(run_id))
        runs.append(found)
    names = query.names
    if names is not None:
        held = {n for found in runs for n in found["series"]}
        missing = [n for n in names if n not in held]
        if missing:
            raise HTTPException(404, f"No run asked for has a series {missing[0]!r}")
    batches: Batches = (
        ((found["id"], found["name"], n), points)
        for found in runs
        for n in (found["series"] if names is None else names)
        if n in found["series"]
        for points in query.points(store, found["id"], n)
    )
    return query.answer(batches, RUN_SERIES, "runs")


def _releasing(body: Iterator[bytes], slot: threading.BoundedSemaphore) -> Iterator[bytes]:
    """``body``, giving its export's slot back once it is sent, or abandoned (a client that
    went away: the generator is closed)."""
    try:
        yield from body
    finally:
        slot.release()


def _in_range(points: ArrayColumns, min_step: int | None, max_step: int | None) -> ArrayColumns:
    """The points of a batch whose step is in ``[min_step, max_step]`` (frame order: a mask,
    not a slice, since a series' steps need not grow)."""
    if min_step is None and max_step is None:
        return points
    steps = points.steps
    keep = np.ones(steps.size, dtype=bool)
    if min_step is not None:
        keep &= steps >= min_step
    if max_step is not None:
        keep &= steps <= max_step
    return Columns(steps[keep], points.times[keep], points.values[keep])


Limit = Annotated[int, Query(ge=1, le=10_000)]


@router.get("/runs/{run_id}/alerts")
def run_alerts(
    run_id: str, store: StoreDep, who: Reader, state: AlertState | None = None, limit: Limit = 1000
) -> AlertsAnswer:
    """Alerts of one run, newest first."""
    run = store.runs.get_run(run_id, job=False, metrics=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    return {"alerts": store.alerts.list_alerts(run_id=run_id, state=state, limit=limit)}


@router.get("/alerts")
def list_alerts(
    store: StoreDep,
    who: Reader,
    state: AlertState | None = None,
    project: str | None = None,
    severity: Severity | None = None,
    limit: Limit = 500,
) -> AlertsAnswer:
    """Alerts across runs, newest first, optionally only those ``firing``, ``resolved`` or
    ``closed`` (when their run ended)."""
    seen = scoped(who, project)
    if isinstance(seen, NoProject):
        return {"alerts": []}
    project = seen
    alerts = store.alerts.list_alerts(state=state, project=project, severity=severity, limit=limit)
    return {"alerts": alerts}


class AckRequest(BaseModel):
    by: str | None = Field(default=None, max_length=200)


class SilenceRequest(BaseModel):
    duration_s: float = Field(default=3600.0, gt=0, le=30 * 86400)
    by: str | None = Field(default=None, max_length=200)


@router.post("/alerts/{alert_id}/ack")
async def acknowledge_alert(
    alert_id: str, engine: AlertsDep, store: StoreDep, who: Admin, body: AckRequest | None = None
) -> AlertRow:
    """Acknowledge an alert: someone is on it (it leaves the banner; it still resolves).
    Recorded as the token's name (``by`` only without auth)."""
    alert_for(store, who, alert_id, Role.ADMIN)
    alert = await engine.acknowledge(alert_id, _by(who, body.by if body else None))
    if alert is None:
        raise alert_not_found(alert_id)
    return alert


@router.post("/alerts/{alert_id}/silence")
async def silence_alert(
    alert_id: str,
    engine: AlertsDep,
    store: StoreDep,
    who: Admin,
    body: SilenceRequest | None = None,
) -> SilenceAnswer:
    """Silence the alert's rule and subject on its run for ``duration_s`` seconds: alerts
    are still recorded, but neither bannered nor notified."""
    body = body or SilenceRequest()
    alert_for(store, who, alert_id, Role.ADMIN)
    result = await engine.silence(alert_id, body.duration_s, _by(who, body.by))
    if result is None:
        raise alert_not_found(alert_id)
    alert, silence = result
    return {"alert": alert, "silence": silence}


@router.get("/rules")
def effective_rules(engine: AlertsDep, who: Reader, project: str | None = None) -> RulesAnswer:
    """The thresholds in force (defaults, the rules file, and ``project``'s overrides). A
    token of one project asking for another's gets the defaults, as for a project without
    overrides: it learns nothing of the others."""
    seen = scoped(who, project) if project else None
    rules = engine.rules.for_project(seen) if isinstance(seen, str) else engine.rules.defaults
    return {"project": project, "rules": rules.as_dict()}


def _by(who: Principal, said: str | None) -> str:
    """Who acted: the token's name; without auth, what the browser said, else ``local``."""
    return (said or LOCAL.name) if who is LOCAL else who.name
