"""One run on a trainvitals server, as :meth:`trainvitals.Api.run` and ``runs`` give it:
what the runs list tells of it, and its history, alerts, edits and deletion.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from trainvitals.client.answers import Alert, MetricSummary, RunHealth
from trainvitals.exceptions import ApiError, ConfigurationError
from trainvitals.json_types import JsonObject

if TYPE_CHECKING:
    import pandas

    from trainvitals.client import Api


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
    health: RunHealth = field(default_factory=lambda: RunHealth())
    #: Its hyper-parameters, as the training script gave them.
    config: JsonObject = field(default_factory=dict)
    #: The summaries of the series :meth:`Api.runs` was asked for (``metrics=``), by name.
    metrics: dict[str, MetricSummary] = field(default_factory=dict)
    series: list[str] = field(default_factory=list)
    traceback: str | None = None

    @classmethod
    def _from(cls, api: Api, answer: JsonObject) -> ApiRun:
        """The run from the server's answer, leaving out the fields this client does not
        know. The types of those it knows are the API's contract, not checked again here."""
        known = {f.name for f in fields(cls)} - {"api"}
        given: Any = {k: v for k, v in answer.items() if k in known}
        return cls(api=api, **given)

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
            f"/api/v1/runs/{path_segment(self.id)}",
            body={k: v for k, v in edit.items() if v is not None},
        )
        kept = {f.name: getattr(self, f.name) for f in fields(self)}
        return ApiRun._from(self.api, {**kept, **answer})

    def delete(self) -> None:
        """Delete the run with its points, alerts and notices (``admin``; a run still running
        is refused with ``409``)."""
        self.api._request("DELETE", f"/api/v1/runs/{path_segment(self.id)}")

    def alerts(self, state: Literal["firing", "resolved", "closed"] | None = None) -> list[Alert]:
        """The run's alerts, newest first (``state``: only firing or only resolved ones)."""
        params = {"state": state} if state else {}
        answer = self.api._get_json(f"/api/v1/runs/{path_segment(self.id)}/alerts", params)
        alerts: list[Alert] = answer["alerts"]
        return alerts


def path_segment(text: str) -> str:
    """``text`` (a run's or a token's id) as one segment of a URL's path."""
    return quote(text, safe="")


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
