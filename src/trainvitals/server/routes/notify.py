"""``/api/v1/notify`` routes: the notification channels and how their deliveries go."""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter

from trainvitals.server.answers import (
    API_ERRORS,
    ChannelAnswer,
    ChannelsAnswer,
    NotificationsAnswer,
)
from trainvitals.server.auth import Reader, alert_for
from trainvitals.server.deps import StateDep, StoreDep
from trainvitals.server.errors import StrictJSONRoute
from trainvitals.server.notify.store import no_notices
from trainvitals.server.storage.tokens import Role

router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)


@router.get("/notify/channels")
def list_channels(state: StateDep, who: Reader) -> ChannelsAnswer:
    """Every channel with its routing and pace, and its deliveries so far: ``pending``,
    ``delivered``, ``failed``, ``last_delivered_at``, ``last_error``. URLs and secrets are
    never shown, only the target's scheme and host. A token of one project sees the channels
    its alerts go to, routed for that project alone, and their deliveries of its alerts."""
    only = who.projects
    summary = state.store.outbox.notice_summary(project=only)
    channels: list[ChannelAnswer] = []
    for channel in state.notify.channels:
        described = channel.describe()
        if only is not None and channel.projects is not None:
            if only not in channel.projects:
                continue
            described["projects"] = [only]
        channels.append(
            cast(ChannelAnswer, {**described, **summary.get(channel.name, no_notices())})
        )
    return {"channels": channels}


@router.get("/alerts/{alert_id}/notifications")
def alert_notifications(alert_id: str, store: StoreDep, who: Reader) -> NotificationsAnswer:
    """What was sent about one alert, where, and how it went, oldest first."""
    alert_for(store, who, alert_id, Role.READ)
    return {"notifications": store.outbox.list_notices(alert_id)}
