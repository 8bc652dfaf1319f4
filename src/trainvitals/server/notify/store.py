"""The notify outbox's queries, used by :mod:`~trainvitals.server.notify.outbox` (its table,
``outbox``, is in :mod:`~trainvitals.server.storage.schema` with the others)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

from sqlalchemy import (
    Engine,
    func,
    select,
    true,
    update,
)
from sqlalchemy.sql.elements import ColumnElement
from typing_extensions import TypedDict  # pydantic reads these on 3.11

from trainvitals.detect.types import jsonable
from trainvitals.server.notify.messages import Notice, NoticeChange
from trainvitals.server.storage.alerts import AlertRow
from trainvitals.server.storage.schema import alerts, outbox
from trainvitals.server.storage.unit_of_work import UnitOfWork


class NoticeRow(TypedDict):
    """A notice as stored, but for its alert: where it goes and how its delivery went."""

    id: str
    channel: str
    alert_id: str
    change: NoticeChange
    created_at: float
    state: str  # pending, delivered or failed (given up)
    attempts: int
    last_error: str | None
    done_at: float | None
    owner: str  # the server that delivers it while pending
    lease_until: float


class ClaimedNotice(NoticeRow):
    """A pending notice taken over for delivery, with its alert."""

    alert: AlertRow


class ChannelSummary(TypedDict):
    """How a channel's deliveries go."""

    pending: int
    delivered: int
    failed: int
    last_delivered_at: float | None
    last_error: str | None


def no_notices() -> ChannelSummary:
    """The summary of a channel that has had no notices."""
    return ChannelSummary(pending=0, delivered=0, failed=0, last_delivered_at=None, last_error=None)


class OutboxStore:
    """The ``outbox`` table: notices queued, leased, delivered or given up."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- writes (writer thread) --------------------------------------------------------------

    def add_notices(
        self, work: UnitOfWork, notices: Sequence[Notice], owner: str, lease_until: float
    ) -> None:
        """Queue notices for delivery by ``owner``."""
        conn = work.connection()
        if notices:
            rows = [
                {
                    "id": n.id,
                    "channel": n.channel,
                    "alert_id": n.alert.id,
                    "change": n.change,
                    "alert": json.dumps(jsonable(n.alert.as_dict()), allow_nan=False),
                    "created_at": n.created_at,
                    "state": "pending",
                    "attempts": 0,
                    "owner": owner,
                    "lease_until": lease_until,
                }
                for n in notices
            ]
            conn.execute(outbox.insert(), rows)

    def last_notice_change(self, work: UnitOfWork, alert_id: str, channel: str) -> str | None:
        """The change (``fired``, ``resolved``) of the alert last queued for ``channel``."""
        conn = work.connection()
        query = (
            select(outbox.c.change)
            .where(outbox.c.alert_id == alert_id, outbox.c.channel == channel)
            .order_by(outbox.c.created_at.desc())
            .limit(1)
        )
        return conn.execute(query).scalar()

    def claim_notices(
        self, work: UnitOfWork, owner: str, channels: list[str], now: float, lease_until: float
    ) -> list[ClaimedNotice]:
        """Renew ``owner``'s leases, then take over the pending notices of ``channels`` whose
        lease ran out (their server died); returns those taken, oldest first. One
        ``UPDATE ... RETURNING``, so two servers never take the same notice."""
        conn = work.connection()
        pending = outbox.c.state == "pending"
        conn.execute(
            update(outbox).where(pending, outbox.c.owner == owner).values(lease_until=lease_until)
        )
        taken = conn.execute(
            update(outbox)
            .where(pending, outbox.c.lease_until < now, outbox.c.channel.in_(channels))
            .values(owner=owner, lease_until=lease_until)
            .returning(*outbox.c)
        ).mappings()
        rows = [cast(ClaimedNotice, {**row, "alert": json.loads(row["alert"])}) for row in taken]
        return sorted(rows, key=lambda row: (row["created_at"], row["id"]))

    def release_notices(self, work: UnitOfWork, owner: str) -> None:
        """``owner`` stops: whoever starts next takes its pending notices at once."""
        conn = work.connection()
        conn.execute(
            update(outbox)
            .where(outbox.c.state == "pending", outbox.c.owner == owner)
            .values(lease_until=0.0)
        )

    def notice_attempted(self, work: UnitOfWork, ids: list[str], error: str) -> None:
        conn = work.connection()
        conn.execute(
            update(outbox)
            .where(outbox.c.id.in_(ids))
            .values(attempts=outbox.c.attempts + 1, last_error=error)
        )

    def notices_done(
        self, work: UnitOfWork, ids: list[str], state: str, when: float, error: str | None = None
    ) -> None:
        """Mark notices ``delivered`` or ``failed`` (given up)."""
        conn = work.connection()
        values: dict[str, str | float | ColumnElement[int]] = {
            "state": state,
            "done_at": when,
            "attempts": outbox.c.attempts + 1,
        }
        if error is not None:
            values["last_error"] = error
        conn.execute(update(outbox).where(outbox.c.id.in_(ids)).values(**values))

    # -- reads (thread pool) -----------------------------------------------------------------

    def notice_summary(self, project: str | None = None) -> dict[str, ChannelSummary]:
        """Per channel that has had notices: how many are pending, delivered and failed,
        when the last one was delivered, and the last error; of ``project``'s alerts only
        when given (a token of one project learns nothing of the others')."""
        out: dict[str, ChannelSummary] = {}
        of_project = (
            outbox.c.alert_id.in_(select(alerts.c.id).where(alerts.c.project == project))
            if project is not None
            else true()
        )
        with self._engine.connect() as conn:
            counts = conn.execute(
                select(outbox.c.channel, outbox.c.state, func.count(), func.max(outbox.c.done_at))
                .where(of_project)
                .group_by(outbox.c.channel, outbox.c.state)
            )
            for channel, state, count, done in counts:
                summary = out.setdefault(channel, no_notices())
                if state == "delivered":
                    summary["delivered"], summary["last_delivered_at"] = count, done
                elif state == "failed":
                    summary["failed"] = count
                else:
                    summary["pending"] = count
            for channel, summary in out.items():
                summary["last_error"] = conn.execute(
                    select(outbox.c.last_error)
                    .where(
                        outbox.c.channel == channel, outbox.c.last_error.is_not(None), of_project
                    )
                    .order_by(outbox.c.created_at.desc())
                    .limit(1)
                ).scalar()
        return out

    def open_counts(self) -> dict[tuple[str, str], int]:
        """``{(channel, state): notices}`` of the pending and failed ones (for ``GET
        /metrics``; unlike :meth:`notice_summary` it leaves the delivered rows unread)."""
        query = (
            select(outbox.c.channel, outbox.c.state, func.count())
            .where(outbox.c.state.in_(("pending", "failed")))
            .group_by(outbox.c.channel, outbox.c.state)
        )
        with self._engine.connect() as conn:
            return {(channel, state): int(n) for channel, state, n in conn.execute(query)}

    def list_notices(self, alert_id: str) -> list[NoticeRow]:
        """The notices of one alert, oldest first (what was sent where, and how it went)."""
        query = (
            select(outbox)
            .where(outbox.c.alert_id == alert_id)
            .order_by(outbox.c.created_at, outbox.c.id)
        )
        with self._engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        for row in rows:
            row.pop("alert")
        return cast(list[NoticeRow], rows)
