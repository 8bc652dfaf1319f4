"""The answers of a trainvitals server's HTTP API, as :class:`trainvitals.Api` returns them.

Light twins of the server's own types (``server/answers.py``, ``server/storage``), which need
the server's packages; ``tests/test_client.py`` keeps each pair equal. Import them from
:mod:`trainvitals.client`.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from trainvitals.json_types import JsonObject

ExportFormat = Literal["csv", "jsonl", "parquet"]
RunStatus = Literal["running", "stalled", "finished", "crashed", "lost"]
#: A run's field to sort by (:meth:`Api.runs` also sorts by a series' statistic:
#: ``"last:NAME"``, ``"min:NAME"`` or ``"max:NAME"``).
RunSort = Literal[
    "started_at", "name", "project", "status", "last_step", "last_seen", "host", "ended_at"
]


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
    evidence: JsonObject  # the numbers that triggered it: each rule has its own
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


class RunHealth(TypedDict, total=False):
    """A run's health at a glance, from every alert it raised (the light twin of the server's
    ``RunHealth``); empty from a server too old to tell."""

    #: The worst severity any of its alerts reached (``info``, ``warning``, ``critical``);
    #: None: it raised none.
    worst: str | None
    #: The rules that raised an alert on it, sorted.
    rules: list[str]
    #: Those of them with an alert firing now, sorted.
    firing: list[str]


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
