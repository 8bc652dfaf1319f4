"""``GET /metrics``: the Prometheus text format (see docs/operations.md#metrics)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from trainvitals.server.auth import Scraper
from trainvitals.server.deps import StateDep
from trainvitals.server.metrics import TeamCounts
from trainvitals.server.store import Store
from trainvitals.server.writer import is_outage

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(state: StateDep, who: Scraper) -> Response:
    """This process's counters, the team's runs, alerts and notifications, and the vitals of
    the running runs this process judges. Needs a token of every project (role ``metrics``,
    ``read`` or ``admin``) unless auth is off."""
    # The detectors live on the event loop: their readings are copied here, between frames;
    # the database is read on a worker thread.
    vitals, omitted = state.alerts.vitals(state.settings.metrics_max_runs)
    try:
        team = await asyncio.to_thread(_team_counts, state.store)
    except Exception as exc:
        if not is_outage(exc):
            raise
        team = TeamCounts()  # the process's own counters still tell of the outage

    body = await asyncio.to_thread(state.metrics.exposition, team, vitals, omitted)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _team_counts(store: Store) -> TeamCounts:
    return TeamCounts(
        runs=store.runs.count_by_status(),
        firing=store.alerts.firing_counts(),
        notices=store.outbox.open_counts(),
    )
