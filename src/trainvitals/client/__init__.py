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

import os
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from trainvitals.agent.config import DEFAULT_SERVER
from trainvitals.client.answers import (
    Alert,
    ExportFormat,
    MetricSummary,
    NewToken,
    RunHealth,
    RunSort,
    RunStatus,
    Token,
)
from trainvitals.client.run import ApiRun, path_segment
from trainvitals.exceptions import ApiError, ConfigurationError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Alert",
    "Api",
    "ApiRun",
    "ExportFormat",
    "MetricSummary",
    "NewToken",
    "RunHealth",
    "RunSort",
    "RunStatus",
    "Token",
]

CLIENT_HINT = "trainvitals.Api needs httpx: pip install 'trainvitals[client]'"
#: A query parameter's value, as httpx takes it (a list repeats the parameter).
QueryValue: TypeAlias = str | int | float | bool | Sequence[str | int | float | bool | None] | None
#: Runs fetched a request when :meth:`Api.runs` pages through every match (the route's cap).
_PAGE = 10_000


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
        params: dict[str, QueryValue] = {
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
        return ApiRun._from(self, self._get_json(f"/api/v1/runs/{path_segment(run_id)}"))

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
        revoked: Token = self._request("DELETE", f"/api/v1/tokens/{path_segment(token_id)}")
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
            path, runs = f"/api/v1/runs/{path_segment(run_id)}/export", []
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

    def _get_json(self, path: str, params: Mapping[str, QueryValue] | None = None) -> Any:
        return self._request("GET", path, params=params)

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, QueryValue] | None = None,
        body: Any = None,
    ) -> Any:
        import httpx

        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise _unreached(self.server, exc) from exc
        if not 200 <= response.status_code < 300:
            raise _refused(response)
        return response.json()


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
