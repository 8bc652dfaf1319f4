"""``/api/v1`` routes of runs: list, read, edit and delete them, and their projects."""

from __future__ import annotations

import asyncio
import re
import time
from functools import partial
from typing import Annotated, Literal, cast

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from trainvitals.protocol import UNSAFE_CHARS, RunStatus
from trainvitals.series import HOST_PREFIX
from trainvitals.server.answers import (
    API_ERRORS,
    DeletedAnswer,
    ListedRun,
    ProjectsAnswer,
    RunAnswer,
    RunsAnswer,
)
from trainvitals.server.auth import Admin, NoProject, Reader, check_project, scoped
from trainvitals.server.deps import StateDep, StoreDep, run_not_found
from trainvitals.server.errors import StrictJSONRoute
from trainvitals.server.run_lifecycle import ALIVE
from trainvitals.server.schemas import SeriesName
from trainvitals.server.storage import RunEdit, RunFilter, RunSummary
from trainvitals.server.storage.run_queries import METRIC_STATS, SORTS
from trainvitals.server.storage.tokens import Role

router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)

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
