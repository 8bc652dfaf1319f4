"""``/api/v1`` REST routes: runs, series, alerts."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from trainvitals.server.deps import StoreDep, run_not_found
from trainvitals.server.downsample import downsample_indices
from trainvitals.server.live import finite_or_none

router = APIRouter(prefix="/api/v1")

MAX_POINTS_LIMIT = 100_000


@router.get("/runs")
def list_runs(
    store: StoreDep,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> dict[str, Any]:
    """Runs, newest first."""
    return {"runs": store.list_runs(limit=limit, project=project)}


@router.get("/runs/{run_id}")
def get_run(run_id: str, store: StoreDep) -> dict[str, Any]:
    """One run with its config, environment, series names and how it ended."""
    run = store.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    return run


@router.get("/runs/{run_id}/series")
def get_series(
    run_id: str,
    store: StoreDep,
    name: Annotated[list[str] | None, Query()] = None,
    max_points: Annotated[int, Query(ge=2, le=MAX_POINTS_LIMIT)] = 2000,
) -> dict[str, Any]:
    """Series of a run (all of them when no ``name`` is given), each downsampled to at most
    ``max_points`` with every bucket's min and max kept. NaN/Inf values come back as null."""
    run = store.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    names = name if name else run["series"]
    out: dict[str, Any] = {}
    for series_name in names:
        steps, times, values = store.read_series(run_id, series_name)
        keep = downsample_indices(values, max_points)
        out[series_name] = {
            "step": steps[keep].tolist(),
            "time": times[keep].tolist(),
            "value": finite_or_none(values[keep].tolist()),
            "count": int(values.size),
        }
    return {"series": out}


@router.get("/runs/{run_id}/alerts")
def run_alerts(run_id: str, store: StoreDep) -> dict[str, Any]:
    """Alerts of one run. (The alert engine lands with issue #5; the shape is the contract.)"""
    if store.get_run(run_id) is None:
        raise run_not_found(run_id)
    return {"alerts": []}


@router.get("/alerts")
def list_alerts(state: str | None = None) -> dict[str, Any]:
    """Alerts across runs, optionally only ``firing`` or ``resolved`` ones."""
    return {"alerts": []}
