"""Alerts as the alert engine last saw them, and the silences people set on them."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple, cast

from sqlalchemy import Connection, Engine, RowMapping, case, func, select, update
from sqlalchemy.sql.elements import ColumnElement
from typing_extensions import TypedDict  # pydantic reads these on 3.11

from trainvitals.detect.types import SEVERITIES, Severity, worse
from trainvitals.server.storage.schema import alerts, dialect_insert, silences
from trainvitals.server.storage.unit_of_work import UnitOfWork

ALERT_FIELDS = tuple(c.name for c in alerts.columns)


class AlertRow(TypedDict):
    """One stored alert (:class:`trainvitals.detect.Alert` as a dict)."""

    id: str
    run_id: str
    project: str
    run_name: str
    rule: str
    subject: str
    severity: str
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


class Silence(TypedDict):
    """A rule and subject silenced on one run until ``until``."""

    id: str
    run_id: str
    rule: str
    subject: str
    until: float
    created_at: float
    created_by: str | None


class RuleStanding(NamedTuple):
    """What one rule raised on one run: its worst severity, and whether it fires now."""

    run_id: str
    rule: str
    worst: Severity
    firing: bool


class RunHealth(TypedDict):
    """A run's health at a glance, from every alert it raised (firing, resolved or closed).

    Example: ``{"worst": "critical", "rules": ["crash", "nonfinite"], "firing": ["crash"]}``;
    a run that raised nothing: ``{"worst": null, "rules": [], "firing": []}``.
    """

    #: The worst severity any of its alerts reached (``info``, ``warning``, ``critical``).
    worst: Severity | None
    #: The rules that raised an alert on it, sorted.
    rules: list[str]
    #: Those of them with an alert firing now, sorted.
    firing: list[str]


class AlertStore:
    """The ``alerts`` and ``silences`` tables."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- writes (writer thread) --------------------------------------------------------------

    def save_alert(self, work: UnitOfWork, alert: Mapping[str, Any]) -> None:
        """Insert or update an alert (the whole row: the alert book holds the truth)."""
        conn = work.connection()
        row = {f: alert[f] for f in ALERT_FIELDS}
        row["evidence"] = json.dumps(alert["evidence"], allow_nan=False)
        statement = dialect_insert(self._engine, alerts).values(**row)
        changed: dict[str, ColumnElement[Any]] = {
            f: statement.excluded[f] for f in ALERT_FIELDS if f != "id"
        }
        # People act on alerts through any replica; the one that judges the run may not know
        # yet: what they did is kept, unless the alert fired again since (the later silence
        # wins).
        same_firing = statement.excluded["count"] == alerts.c["count"]
        for field in ("acknowledged_at", "acknowledged_by"):
            ours = statement.excluded[field]
            changed[field] = case((ours.is_(None) & same_firing, alerts.c[field]), else_=ours)
        theirs, ours = alerts.c.silenced_until, statement.excluded.silenced_until
        changed["silenced_until"] = case(
            (theirs.is_(None), ours), (ours > theirs, ours), else_=theirs
        )
        conn.execute(statement.on_conflict_do_update(index_elements=["id"], set_=changed))

    def acknowledge(
        self, work: UnitOfWork, alert_id: str, when: float, by: str | None
    ) -> AlertRow | None:
        """Someone is on the alert; returns it, or None when there is no such alert."""
        conn = work.connection()
        conn.execute(
            update(alerts)
            .where(alerts.c.id == alert_id)
            .values(acknowledged_at=when, acknowledged_by=by)
        )
        return _alert_row(conn, alert_id)

    def add_silence(self, work: UnitOfWork, silence: Silence) -> None:
        """Store the silence, and mark the alerts it silences. It replaces the silences of
        the same run, rule and subject still in force (they end as it begins, and stay as a
        record): one for a minute after one for an hour ends in a minute, as the alert says."""
        conn = work.connection()
        same = (
            silences.c.run_id == silence["run_id"],
            silences.c.rule == silence["rule"],
            silences.c.subject == silence["subject"],
        )
        begins = silence["created_at"]
        conn.execute(update(silences).where(*same, silences.c.until > begins).values(until=begins))
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
    ) -> list[AlertRow]:
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

    def firing_counts(self) -> dict[tuple[str, str], int]:
        """``{(rule, severity): alerts firing}`` (for ``GET /metrics``)."""
        query = (
            select(alerts.c.rule, alerts.c.severity, func.count())
            .where(alerts.c.state == "firing")
            .group_by(alerts.c.rule, alerts.c.severity)
        )
        with self._engine.connect() as conn:
            return {(rule, severity): int(n) for rule, severity, n in conn.execute(query)}

    def standings(self, run_ids: Collection[str]) -> list[RuleStanding]:
        """Per run and rule, the worst severity its alerts raised and whether one fires now,
        in one grouped query for a whole page of runs."""
        if not run_ids:
            return []
        rank = case({severity: i for i, severity in enumerate(SEVERITIES)}, value=alerts.c.severity)
        firing = case((alerts.c.state == "firing", 1), else_=0)
        query = (
            select(alerts.c.run_id, alerts.c.rule, func.max(rank), func.max(firing))
            .where(alerts.c.run_id.in_(list(run_ids)))
            .group_by(alerts.c.run_id, alerts.c.rule)
        )
        with self._engine.connect() as conn:
            return [
                RuleStanding(run_id, rule, SEVERITIES[worst], bool(fires))
                for run_id, rule, worst, fires in conn.execute(query)
                if worst is not None  # a severity this version does not know
            ]

    def health(self, run_ids: Collection[str]) -> dict[str, RunHealth]:
        """Each run's :class:`RunHealth`, from its :meth:`standings`."""
        health = {run_id: RunHealth(worst=None, rules=[], firing=[]) for run_id in run_ids}
        for standing in sorted(self.standings(run_ids), key=lambda s: s.rule):
            of = health[standing.run_id]
            of["rules"].append(standing.rule)
            if standing.firing:
                of["firing"].append(standing.rule)
            worst = of["worst"]
            of["worst"] = standing.worst if worst is None else worse(worst, standing.worst)
        return health

    def get_alert(self, alert_id: str) -> AlertRow | None:
        with self._engine.connect() as conn:
            return _alert_row(conn, alert_id)

    def active_silences(self, now: float) -> list[Silence]:
        """The silences that have not run out by ``now``."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(silences).where(silences.c.until > now)).mappings()
            return [cast(Silence, dict(r)) for r in rows]


def _alert(row: RowMapping) -> AlertRow:
    alert = dict(row)
    alert["evidence"] = json.loads(alert["evidence"])
    return cast(AlertRow, alert)


def _alert_row(conn: Connection, alert_id: str) -> AlertRow | None:
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).mappings().first()
    return None if row is None else _alert(row)
