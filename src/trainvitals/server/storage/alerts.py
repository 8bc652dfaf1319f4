"""Alerts as the alert engine last saw them, and the silences people set on them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from trainvitals.server.storage.schema import alerts, dialect_insert, silences

ALERT_FIELDS = tuple(c.name for c in alerts.columns)


class AlertStore:
    """The ``alerts`` and ``silences`` tables."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- writes (writer thread) --------------------------------------------------------------

    def save_alert(self, conn: Connection, alert: Mapping[str, Any]) -> None:
        """Insert or update an alert (the whole row: the alert book holds the truth)."""
        row = {f: alert[f] for f in ALERT_FIELDS}
        row["evidence"] = json.dumps(alert["evidence"], allow_nan=False)
        statement = dialect_insert(self._engine, alerts).values(**row)
        changed = {f: statement.excluded[f] for f in ALERT_FIELDS if f != "id"}
        conn.execute(statement.on_conflict_do_update(index_elements=["id"], set_=changed))

    def acknowledge(
        self, conn: Connection, alert_id: str, when: float, by: str | None
    ) -> dict[str, Any] | None:
        conn.execute(
            update(alerts)
            .where(alerts.c.id == alert_id)
            .values(acknowledged_at=when, acknowledged_by=by)
        )
        return _alert_row(conn, alert_id)

    def add_silence(self, conn: Connection, silence: Mapping[str, Any]) -> None:
        conn.execute(silences.insert().values(**silence))
        conn.execute(
            update(alerts)
            .where(
                alerts.c.run_id == silence["run_id"],
                alerts.c.rule == silence["rule"],
                alerts.c.subject == silence["subject"],
            )
            .values(silenced_until=silence["until"])
        )

    # -- reads (thread pool) -----------------------------------------------------------------

    def list_alerts(
        self,
        run_id: str | None = None,
        state: str | None = None,
        project: str | None = None,
        severity: str | None = None,
        limit: int = 500,
    ) -> list[dict[str, Any]]:
        """Alerts, newest first."""
        query = select(alerts).order_by(alerts.c.time.desc(), alerts.c.id).limit(limit)
        for column, value in (
            (alerts.c.run_id, run_id),
            (alerts.c.state, state),
            (alerts.c.project, project),
            (alerts.c.severity, severity),
        ):
            if value is not None:
                query = query.where(column == value)
        with self._engine.connect() as conn:
            return [_alert(row) for row in conn.execute(query).mappings()]

    def get_alert(self, alert_id: str) -> dict[str, Any] | None:
        with self._engine.connect() as conn:
            return _alert_row(conn, alert_id)

    def active_silences(self, now: float) -> list[dict[str, Any]]:
        with self._engine.connect() as conn:
            rows = conn.execute(select(silences).where(silences.c.until > now)).mappings()
            return [dict(r) for r in rows]


def _alert(row: Any) -> dict[str, Any]:
    alert = dict(row)
    alert["evidence"] = json.loads(alert["evidence"])
    return alert


def _alert_row(conn: Connection, alert_id: str) -> dict[str, Any] | None:
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).mappings().first()
    return None if row is None else _alert(row)
