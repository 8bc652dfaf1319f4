"""``/api/v1`` REST routes: runs, series, alerts."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from trainvitals.detect import AlertState, Severity
from trainvitals.detect.types import worse
from trainvitals.lifecycle import ALIVE
from trainvitals.protocol import RunStatus
from trainvitals.series import HOST_PREFIX
from trainvitals.server.answers import (
    API_ERRORS,
    AlertsAnswer,
    RulesAnswer,
    RunAnswer,
    RunHealth,
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
from trainvitals.server.deps import AlertsDep, StoreDep, alert_not_found, run_not_found
from trainvitals.server.downsample import downsample_indices
from trainvitals.server.export import (
    MEDIA_TYPES,
    PARQUET_HINT,
    ExportFormat,
    export,
    parquet_available,
)
from trainvitals.server.live import finite_or_none
from trainvitals.server.storage import AlertRow
from trainvitals.server.storage.tokens import Principal, Role
from trainvitals.server.store import Store

router = APIRouter(prefix="/api/v1", responses=API_ERRORS)

MAX_POINTS_LIMIT = 100_000
#: Series one request may read: a run with thousands of series must not hold a worker.
MAX_SERIES_PER_REQUEST = 200


@router.get("/runs")
def list_runs(
    store: StoreDep,
    who: Reader,
    project: str | None = None,
    job: str | None = None,
    status: RunStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> RunsAnswer:
    """Runs, newest first; ``job``: only the runs (workers) of that job; ``status``: only
    those in that status. A token of one project sees that project's runs only."""
    seen = scoped(who, project)
    if isinstance(seen, NoProject):
        return {"runs": []}
    runs = store.runs.list_runs(limit=limit, project=seen, job=job, status=status)
    health = _health(store, [run["id"] for run in runs])
    return {"runs": [{**run, "health": health[run["id"]]} for run in runs]}


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
            "health": _health(store, [run_id])[run_id],
            "events": store.runs.run_events(run_id),
        },
    )
    if run["status"] not in ALIVE:  # evidence for the ending panel
        out["last_readings"] = store.series.last_values(run_id, (HOST_PREFIX, "gpu"))
    return out


def _health(store: Store, run_ids: list[str]) -> dict[str, RunHealth]:
    """Each run's :class:`RunHealth`, from one grouped query for them all."""
    health = {run_id: RunHealth(worst=None, rules=[], firing=[]) for run_id in run_ids}
    for standing in sorted(store.alerts.standings(run_ids), key=lambda s: s.rule):
        of = health[standing.run_id]
        of["rules"].append(standing.rule)
        if standing.firing:
            of["firing"].append(standing.rule)
        of["worst"] = standing.worst if of["worst"] is None else worse(of["worst"], standing.worst)
    return health


@router.get("/runs/{run_id}/series")
def get_series(
    run_id: str,
    store: StoreDep,
    who: Reader,
    name: Annotated[list[str] | None, Query(max_length=MAX_SERIES_PER_REQUEST)] = None,
    max_points: Annotated[int, Query(ge=2, le=MAX_POINTS_LIMIT)] = 2000,
) -> SeriesAnswer:
    """Series of a run (all of them when no ``name`` is given), each downsampled to at most
    ``max_points`` with every bucket's min and max kept. NaN/Inf values come back as null."""
    run = store.runs.get_run(run_id, job=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    names = name if name else run["series"][:MAX_SERIES_PER_REQUEST]
    out: dict[str, SeriesPoints] = {}
    for series_name in names:
        steps, times, values = store.series.read_series(run_id, series_name)
        keep = downsample_indices(values, max_points)
        out[series_name] = {
            "step": steps[keep].tolist(),
            "time": times[keep].tolist(),
            "value": finite_or_none(values[keep].tolist()),
            "count": int(values.size),
        }
    return {"series": out}


@router.get(
    "/runs/{run_id}/export",
    response_class=StreamingResponse,
    responses={200: {"content": {media: {} for media in MEDIA_TYPES.values()}}},
)
def export_series(
    run_id: str,
    store: StoreDep,
    who: Reader,
    name: Annotated[list[str] | None, Query(max_length=MAX_SERIES_PER_REQUEST)] = None,
    fmt: Annotated[ExportFormat, Query(alias="format")] = ExportFormat.CSV,
) -> StreamingResponse:
    """Every point of the run's series (all of them when no ``name`` is given) at full
    resolution, streamed as CSV, JSON Lines or Parquet (see docs/contract.md#export)."""
    run = store.runs.get_run(run_id, job=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    names = list(dict.fromkeys(name)) if name else run["series"]
    missing = sorted(set(names) - set(run["series"]))
    if missing:
        raise HTTPException(404, f"Run {run_id!r} has no series {missing[0]!r}")
    if fmt is ExportFormat.PARQUET and not parquet_available():
        raise HTTPException(501, PARQUET_HINT)
    batches = ((n, points) for n in names for points in store.series.iter_series(run_id, n))
    return StreamingResponse(
        export(fmt, batches),
        media_type=MEDIA_TYPES[fmt],
        headers={"Content-Disposition": f'attachment; filename="{run_id}.{fmt.value}"'},
    )


Limit = Annotated[int, Query(ge=1, le=10_000)]


@router.get("/runs/{run_id}/alerts")
def run_alerts(
    run_id: str, store: StoreDep, who: Reader, state: AlertState | None = None, limit: Limit = 1000
) -> AlertsAnswer:
    """Alerts of one run, newest first."""
    run = store.runs.get_run(run_id, job=False)
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
    """The thresholds in force (defaults, the rules file, and ``project``'s overrides)."""
    rules = engine.rules.for_project(project) if project else engine.rules.defaults
    return {"project": project, "rules": rules.as_dict()}


def _by(who: Principal, said: str | None) -> str:
    """Who acted: the token's name; without auth, what the browser said, else ``local``."""
    return (said or LOCAL.name) if who is LOCAL else who.name
