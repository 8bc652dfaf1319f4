"""``/api/v1`` routes of a run's series: read them downsampled, or export them whole."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from trainvitals.protocol import ArrayColumns, Columns
from trainvitals.server.answers import API_ERRORS, SeriesAnswer, SeriesPoints
from trainvitals.server.auth import Reader, check_project
from trainvitals.server.deps import StoreDep, get_state, run_not_found
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
from trainvitals.server.storage.tokens import Role
from trainvitals.server.store import Store

router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)

MAX_POINTS_LIMIT = 100_000
#: Steps are exact in a browser up to 2^53, and ingest refuses larger ones.
STEP_BOUND = 2**53
#: Series one request may read: a run with thousands of series must not hold a worker.
MAX_SERIES_PER_REQUEST = 200
#: Runs one export may hold (the dashboard compares at most 10).
MAX_RUNS_PER_EXPORT = 50


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
