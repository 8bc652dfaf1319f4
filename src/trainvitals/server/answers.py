"""The shapes of the REST API's answers, so ``/openapi.json`` describes them and mypy checks
the routes build them. The rows themselves are storage's (:mod:`trainvitals.server.storage`,
:mod:`trainvitals.server.notify.store`); these add the envelopes and what a route computes."""

from __future__ import annotations

from typing import (
    Any,
    NotRequired,  # pydantic reads these on 3.11
)

from typing_extensions import TypedDict

from trainvitals.server.notify.config import ChannelDescription
from trainvitals.server.notify.store import ChannelSummary, NoticeRow
from trainvitals.server.storage import AlertRow, RunDetail, RunEvent, RunHealth, Silence
from trainvitals.server.storage import ListedRun as PageRun


class ListedRun(PageRun):
    health: RunHealth


class RunsAnswer(TypedDict):
    runs: list[ListedRun]
    #: How many runs match the filters, over all pages.
    total: int


class ProjectsAnswer(TypedDict):
    #: The projects that have a run, sorted.
    projects: list[str]


class DeletedAnswer(TypedDict):
    #: The id of the run deleted.
    deleted: str


class RunAnswer(RunDetail):
    health: RunHealth
    events: list[RunEvent]
    #: The last host and GPU readings, for the ending panel of a run that ended.
    last_readings: NotRequired[dict[str, float]]


class SeriesPoints(TypedDict):
    """One series, downsampled: NaN and infinities come back as null."""

    step: list[int]
    time: list[float]
    value: list[float | None]
    #: Points stored, before downsampling.
    count: int


class SeriesAnswer(TypedDict):
    series: dict[str, SeriesPoints]


class AlertsAnswer(TypedDict):
    alerts: list[AlertRow]


class SilenceAnswer(TypedDict):
    alert: AlertRow
    silence: Silence


class RulesAnswer(TypedDict):
    project: str | None
    rules: dict[str, dict[str, Any]]


class ChannelAnswer(ChannelDescription, ChannelSummary):
    """A channel as the API shows it: its routing and pace (never its URL or secret) and how
    its deliveries went."""


class ChannelsAnswer(TypedDict):
    channels: list[ChannelAnswer]


class NotificationsAnswer(TypedDict):
    notifications: list[NoticeRow]


class ErrorAnswer(TypedDict):
    """Every refusal: a reason a person can read, never the secret parts of the input."""

    detail: str


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorAnswer, "description": description}


#: What any ``/api/v1`` route may answer besides its own, so ``/openapi.json`` says so.
API_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("The Host header names no address this server answers to"),
    401: _error("No valid token or session"),
    403: _error("A request from another site, or a role that does not allow this"),
    404: _error("No such run or alert, or one of another project"),
    413: _error("A body over the limit (1 MiB unless configured)"),
    415: _error("A write whose body is not JSON"),
    503: _error("The database cannot be used now, or too many exports run: see Retry-After"),
}


class TokenAnswer(TypedDict):
    """A token as an admin sees it listed: never its secret."""

    id: str
    name: str
    project: str
    role: str
    created_at: float
    revoked_at: float | None
    #: When a request, websocket or browser session last proved itself with it, to a minute;
    #: null: never (or not since this field came).
    last_used_at: float | None
    #: The token this request was made with (or its browser session's).
    current: bool


class TokensAnswer(TypedDict):
    tokens: list[TokenAnswer]
    #: The tokens the list's ``revoked`` filter matches, all pages.
    total: int
    #: Every token the admin governs, whatever the filter: live, revoked, and revoked and
    #: presented whole after it (refused).
    live: int
    revoked: int
    tried_after_revoke: int


class NewTokenAnswer(TokenAnswer):
    #: The token itself (``tv_<id>_<secret>``): in this answer only.
    token: str


#: What the token routes may answer besides the rest.
TOKEN_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: _error("A project at its live tokens' limit, or the last admin token of every project"),
}
