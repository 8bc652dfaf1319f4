"""A client of a trainvitals server's HTTP API, for notebooks and scripts.

``trainvitals.Api`` lists runs, reads a run's alerts, and pulls a run's history at full
resolution into a pandas DataFrame (through ``GET /api/v1/runs/{id}/export``). It needs
``httpx`` (and pandas for :meth:`ApiRun.history`): ``pip install 'trainvitals[client]'``.

Example:
    ```python
    import trainvitals

    api = trainvitals.Api(server="http://10.0.0.5:8600", token="tv_...")
    for run in api.runs(project="mnist", status="crashed"):
        print(run.name, run.end_reason, [a["rule"] for a in run.alerts()])
    loss = api.run("3f2a...").history(["loss", "grad/global_norm"])
    ```
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any, Literal, NotRequired, TypedDict
from urllib.parse import quote, urlsplit

from trainvitals.agent.config import DEFAULT_SERVER
from trainvitals.exceptions import ApiError, ConfigurationError

if TYPE_CHECKING:
    import httpx
    import pandas

__all__ = ["Alert", "Api", "ApiRun", "ExportFormat"]

CLIENT_HINT = "trainvitals.Api needs httpx: pip install 'trainvitals[client]'"
ExportFormat = Literal["csv", "jsonl", "parquet"]
RunStatus = Literal["running", "stalled", "finished", "crashed", "lost"]
#: A run's field to sort by (:meth:`Api.runs` also sorts by a series' statistic:
#: ``"last:NAME"``, ``"min:NAME"`` or ``"max:NAME"``).
RunSort = Literal[
    "started_at", "name", "project", "status", "last_step", "last_seen", "host", "ended_at"
]
#: Runs fetched a request when :meth:`Api.runs` pages through every match (the route's cap).
_PAGE = 10_000


class Alert(TypedDict):
    """An alert as the server tells it (docs/contract.md#alerts): the light twin of the
    server's ``AlertRow``, which needs the server's packages (a test keeps the two equal)."""

    id: str
    run_id: str
    project: str
    run_name: str
    rule: str
    subject: str
    severity: str  # info, warning, critical
    state: str  # firing, resolved or closed
    message: str
    hint: str
    evidence: dict[str, Any]
    step: int
    time: float
    updated_time: float
    resolved_time: float | None
    count: int
    acknowledged_at: float | None
    acknowledged_by: str | None
    silenced_until: float | None
    closed_time: float | None
    closed_reason: str | None


class MetricSummary(TypedDict):
    """A run's series at a glance (the light twin of the server's ``MetricSummary``):
    ``last``, its value at ``step``, its highest step (None when NaN or ±Inf, which
    ``nonfinite`` names: ``nan``, ``inf``, ``-inf``); ``min`` and ``max``, its least and
    greatest finite values."""

    step: int
    last: float | None
    min: float | None
    max: float | None
    nonfinite: NotRequired[str]


class Token(TypedDict):
    """An access token as an admin sees it listed: never its secret (the light twin of the
    server's ``TokenAnswer``)."""

    id: str
    name: str
    project: str
    role: str  # ingest, read, admin or metrics
    created_at: float
    revoked_at: float | None
    #: When it was last used, to a minute; None: never.
    last_used_at: float | None
    #: The token this client speaks with.
    current: bool


class NewToken(Token):
    #: The token itself (``tv_<id>_<secret>``): this is the only time it is shown.
    token: str


@dataclass(frozen=True)
class ApiRun:
    """A run on the server, with what the runs list tells of it; :meth:`Api.run` also fills
    ``config``, ``series`` (its series' names) and ``traceback``.

    Example:
        ```python
        run = api.run(run_id)
        frame = run.history(["loss"])        # name, step, time, value: every point
        firing = run.alerts(state="firing")
        ```
    """

    api: Api = field(repr=False, compare=False)
    id: str
    project: str
    name: str
    status: str  # running, stalled, finished, crashed, lost
    started_at: float
    ended_at: float | None
    last_step: int | None
    last_seen: float
    host: str
    end_reason: str | None
    job_id: str | None = None
    worker: str | None = None
    #: The training process that made it: the runs of one loop of fits share it.
    process_key: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    archived: bool = False
    #: The worst alert it raised, firing or not: ``{"worst": "critical", "rules": [...],
    #: "firing": [...]}`` (``worst`` None: it raised none).
    health: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    #: The summaries of the series :meth:`Api.runs` was asked for (``metrics=``), by name.
    metrics: dict[str, MetricSummary] = field(default_factory=dict)
    series: list[str] = field(default_factory=list)
    traceback: str | None = None

    @classmethod
    def _from(cls, api: Api, answer: dict[str, Any]) -> ApiRun:
        known = {f.name for f in fields(cls)} - {"api"}
        return cls(api=api, **{k: v for k, v in answer.items() if k in known})

    def history(
        self,
        names: Sequence[str] = (),
        format: Literal["parquet", "jsonl"] | None = None,
        *,
        min_step: int | None = None,
        max_step: int | None = None,
    ) -> pandas.DataFrame:
        """Every point of the run's series ``names`` (all of them when empty), at full
        resolution: a DataFrame of ``name`` (categorical), ``step`` (int64), ``time`` and
        ``value`` (float64; NaN and ±Inf as they were sent), one row a point, each series in
        the order it was sent. ``min_step`` and ``max_step`` (inclusive): only those steps.

        Read as Parquet when pyarrow is installed here (and on the server), else as JSON
        Lines; ``format`` picks one.

        Example:
            ```python
            frame = api.run(run_id).history(["loss", "grad/global_norm"])
            wide = frame.pivot_table(index="step", columns="name", values="value")
            wide.plot(logy=True)
            before = api.run(run_id).history(["loss"], min_step=900, max_step=1000)
            ```
        """
        try:
            import pandas
        except ImportError as exc:
            raise ConfigurationError(
                "ApiRun.history needs pandas: pip install 'trainvitals[client]'"
            ) from exc
        chosen = format or ("parquet" if _has_pyarrow() else "jsonl")
        steps = {"min_step": min_step, "max_step": max_step}
        body = io.BytesIO()
        try:
            self.api.export(self.id, names, format=chosen, to=body, **steps)
        except ApiError as exc:
            if format is not None or exc.status != 501:
                raise
            chosen = "jsonl"  # a server without pyarrow: the other exact format
            body = io.BytesIO()
            self.api.export(self.id, names, format=chosen, to=body, **steps)
        body.seek(0)
        if chosen == "parquet":
            frame = pandas.read_parquet(body)
        else:
            frame = _read_jsonl(body)
        frame["name"] = frame["name"].astype("category")
        return frame

    def edit(
        self,
        *,
        name: str | None = None,
        tags: Sequence[str] | None = None,
        notes: str | None = None,
        archived: bool | None = None,
    ) -> ApiRun:
        """Rename, tag (the whole list), note or archive the run (a token with the ``admin``
        role on its project); returns it as the server now has it.

        Example:
            ```python
            run = run.edit(tags=[*run.tags, "baseline"], notes="lr 3e-4, warmup 500")
            ```
        """
        edit = {"name": name, "tags": None if tags is None else list(tags), "notes": notes,
                "archived": archived}  # fmt: skip
        answer = self.api._request(
            "PATCH",
            f"/api/v1/runs/{_path(self.id)}",
            body={k: v for k, v in edit.items() if v is not None},
        )
        kept = {f.name: getattr(self, f.name) for f in fields(self)}
        return ApiRun._from(self.api, {**kept, **answer})

    def delete(self) -> None:
        """Delete the run with its points, alerts and notices (``admin``; a run still running
        is refused with ``409``)."""
        self.api._request("DELETE", f"/api/v1/runs/{_path(self.id)}")

    def alerts(self, state: Literal["firing", "resolved", "closed"] | None = None) -> list[Alert]:
        """The run's alerts, newest first (``state``: only firing or only resolved ones)."""
        params = {"state": state} if state else {}
        answer = self.api._get_json(f"/api/v1/runs/{_path(self.id)}/alerts", params)
        alerts: list[Alert] = answer["alerts"]
        return alerts


class Api:
    """The HTTP API of a trainvitals server.

    Args:
        server: its base URL, such as ``http://10.0.0.5:8600``; default
            ``$TRAINVITALS_SERVER``, else ``http://127.0.0.1:8600``.
        token: an access token with the ``read`` role (``trainvitals token create``); default
            ``$TRAINVITALS_TOKEN``. A server run without auth needs none.
        timeout: seconds to wait for the server to answer (between two pieces of a stream).

    Every failed request raises :class:`trainvitals.exceptions.ApiError` with the server's
    status and reason (``404: No run with id 'x'``).

    Example:
        ```python
        with trainvitals.Api(server="http://10.0.0.5:8600") as api:
            latest = api.runs(project="mnist", limit=1)[0]
            print(latest.status, latest.history(["loss"]).value.min())
        ```
    """

    def __init__(
        self, server: str | None = None, token: str | None = None, timeout: float = 30.0
    ) -> None:
        try:
            import httpx
        except ImportError as exc:
            raise ConfigurationError(CLIENT_HINT) from exc
        self.server = (server or os.environ.get("TRAINVITALS_SERVER") or DEFAULT_SERVER).rstrip("/")
        parts = urlsplit(self.server)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(
                f"Expected a server URL like 'http://10.0.0.5:8600', but got {self.server!r}"
            )
        token = token or os.environ.get("TRAINVITALS_TOKEN") or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close its connections."""
        self._http.close()

    def runs(
        self,
        project: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        job: str | None = None,
        limit: int | None = 500,
        *,
        name: str | None = None,
        tag: str | None = None,
        health: Literal["critical", "warning", "healthy"] | None = None,
        archived: Literal["hide", "only", "include"] = "hide",
        sort: RunSort | str = "started_at",
        descending: bool = True,
        offset: int = 0,
        metrics: Sequence[str] = (),
        process: str | None = None,
    ) -> list[ApiRun]:
        """Runs, newest first (or by ``sort``): of ``project``, in ``status`` (one or several),
        the workers of ``job``, made by the process whose ``process_key`` is ``process``, whose
        name contains ``name``, tagged ``tag``, whose worst alert was ``health`` (``healthy``:
        none); archived runs only with ``archived``. The first
        ``limit`` from ``offset``; ``limit=None``: every run that matches, a page at a time
        (pages read one after another, not one snapshot: a run is listed once). ``sort`` may
        be a series' statistic (``"min:val_loss"``: runs without one come last either way);
        each run's ``metrics`` holds the summaries of the series in ``metrics`` (at most 20).

        Example:
            ```python
            crashed = api.runs(project="mnist", status="crashed")
            sweep = api.runs(tag="sweep-3", sort="name", descending=False, limit=None)
            best = api.runs(sort="min:val_loss", descending=False, limit=5, metrics=["val_loss"])
            print([(r.name, r.metrics.get("val_loss", {}).get("min")) for r in best])
            ```
        """
        params: dict[str, Any] = {
            "project": project,
            "status": [status] if isinstance(status, str) else list(status or ()),
            "job": job,
            "process": process,
            "q": name,
            "tag": tag,
            "health": health,
            "archived": archived,
            "sort": sort,
            "order": "desc" if descending else "asc",
            "metric": list(metrics),
        }
        params = {k: v for k, v in params.items() if v}
        found: dict[str, ApiRun] = {}
        read = 0
        while limit is None or read < limit:
            size = _PAGE if limit is None else min(_PAGE, limit - read)
            page = {**params, "limit": size, "offset": offset + read}
            runs = self._get_json("/api/v1/runs", page)["runs"]
            read += len(runs)
            # Pages are read one after the other, not from one snapshot: a run that a new one
            # pushed onto the next page is not listed twice.
            for run in runs:
                found.setdefault(run["id"], ApiRun._from(self, run))
            if len(runs) < size:
                break
        return list(found.values())

    def projects(self) -> list[str]:
        """The projects that have a run, sorted (those the token may read)."""
        projects: list[str] = self._get_json("/api/v1/projects")["projects"]
        return projects

    def run(self, run_id: str) -> ApiRun:
        """One run, with its config and series names (``ApiError`` 404 when there is none)."""
        return ApiRun._from(self, self._get_json(f"/api/v1/runs/{_path(run_id)}"))

    def tokens(self, revoked: Literal["include", "hide", "only"] = "include") -> list[Token]:
        """The tokens this client's ``admin`` token governs (all of them for an admin of every
        project, else its project's), in the order they were made: revoked ones too, unless
        ``revoked`` is ``hide`` (or ``only``: those alone)."""
        query = "" if revoked == "include" else f"?revoked={revoked}"
        tokens: list[Token] = self._get_json("/api/v1/tokens" + query)["tokens"]
        return tokens

    def create_token(
        self, name: str, project: str, role: Literal["ingest", "read", "admin", "metrics"]
    ) -> NewToken:
        """Make a token (``admin``; of the admin's own project unless it is of every project).
        The answer's ``token`` is the only copy of its secret: store it now.

        Example:
            ```python
            made = api.create_token("ci agents", "vision", "ingest")
            secrets_manager.put("TRAINVITALS_TOKEN", made["token"])
            ```
        """
        made: NewToken = self._request(
            "POST", "/api/v1/tokens", body={"name": name, "project": project, "role": role}
        )
        return made

    def revoke_token(self, token_id: str) -> Token:
        """Revoke a token and end its browser sessions (``admin``); returns it as now listed.
        The last live admin token of every project is refused (``409``)."""
        revoked: Token = self._request("DELETE", f"/api/v1/tokens/{_path(token_id)}")
        return revoked

    def export(
        self,
        run_id: str | Sequence[str],
        names: Sequence[str] = (),
        format: ExportFormat = "csv",
        to: IO[bytes] | None = None,
        *,
        min_step: int | None = None,
        max_step: int | None = None,
    ) -> int:
        """Stream the run's series ``names`` (all when empty) at full resolution into ``to``
        as it arrives (the layout: docs/contract.md#export); returns the bytes written.
        ``min_step`` and ``max_step`` (inclusive): only the points of those steps. A list of
        run ids: their points in one file, each row with its run's id and name (a series one
        run lacks is left out of it).

        Example:
            ```python
            with open("run.parquet", "wb") as out:
                api.export(run_id, ["loss"], format="parquet", to=out)
            ```
        """
        import httpx

        if to is None:
            raise ConfigurationError("Api.export needs a binary file to write to (to=...)")
        if isinstance(run_id, str):
            path, runs = f"/api/v1/runs/{_path(run_id)}/export", []
        elif not run_id:
            raise ConfigurationError("Api.export needs a run id, or a list of at least one")
        else:
            path, runs = "/api/v1/export", [("run", r) for r in run_id]
        params: list[tuple[str, str | int | float | bool | None]] = [
            *runs,
            ("format", format),
            *(("name", n) for n in names),
            *((k, v) for k, v in (("min_step", min_step), ("max_step", max_step)) if v is not None),
        ]
        written = 0
        try:
            with self._http.stream("GET", path, params=params) as response:
                if response.status_code != 200:
                    response.read()
                    raise _refused(response)
                for piece in response.iter_bytes():
                    to.write(piece)
                    written += len(piece)
        except httpx.HTTPError as exc:
            raise _unreached(self.server, exc) from exc
        return written

    def _get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self._request("GET", path, params=params)

    def _request(
        self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        import httpx

        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise _unreached(self.server, exc) from exc
        if not 200 <= response.status_code < 300:
            raise _refused(response)
        return response.json()


def _path(run_id: str) -> str:
    return quote(run_id, safe="")


def _refused(response: httpx.Response) -> ApiError:
    """The server's reason: its ``detail`` (FastAPI's validation errors made one line)."""
    try:
        detail = response.json().get("detail")
    except ValueError:  # not JSON (a proxy's page)
        detail = None
    if isinstance(detail, list):
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg', '')}" for d in detail
        )
    reason = str(detail) if detail else response.reason_phrase or "no reason given"
    return ApiError(response.status_code, reason)


def _unreached(server: str, exc: Exception) -> ApiError:
    return ApiError(None, f"could not read from {server}: {exc or type(exc).__name__}")


def _has_pyarrow() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def _read_jsonl(body: IO[bytes]) -> pandas.DataFrame:
    """The export's JSON Lines as a DataFrame, its ``null`` + ``nonfinite`` values made
    NaN/±Inf again."""
    import pandas

    columns = {"name": "str", "step": "int64", "time": "float64", "value": "float64"}
    if not body.read(1):
        return pandas.DataFrame({c: pandas.Series(dtype=t) for c, t in columns.items()})
    body.seek(0)
    frame = pandas.read_json(body, lines=True, precise_float=True, dtype=columns)
    if "nonfinite" in frame:
        odd = frame["nonfinite"].notna()
        frame.loc[odd, "value"] = frame.loc[odd, "nonfinite"].astype("float64")
        frame = frame.drop(columns="nonfinite")
    return frame[list(columns)]
