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
from trainvitals.server.storage import AlertRow, ListedRun, RunDetail, RunEvent, Silence


class RunsAnswer(TypedDict):
    runs: list[ListedRun]
    #: How many runs match the filters, over all pages.
    total: int


class DeletedAnswer(TypedDict):
    #: The id of the run deleted.
    deleted: str


class RunAnswer(RunDetail):
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
