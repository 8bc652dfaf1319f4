"""``/api/v1`` routes of alerts: list them, acknowledge and silence them, and the rules."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from trainvitals.detect import AlertState, Severity
from trainvitals.server.answers import API_ERRORS, AlertsAnswer, RulesAnswer, SilenceAnswer
from trainvitals.server.auth import (
    LOCAL,
    Admin,
    NoProject,
    Reader,
    alert_for,
    check_project,
    scoped,
)
from trainvitals.server.deps import AlertsDep, StoreDep, alert_not_found, run_not_found
from trainvitals.server.errors import StrictJSONRoute
from trainvitals.server.storage import AlertRow
from trainvitals.server.storage.tokens import Principal, Role

router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)

Limit = Annotated[int, Query(ge=1, le=10_000)]


@router.get("/runs/{run_id}/alerts")
def run_alerts(
    run_id: str, store: StoreDep, who: Reader, state: AlertState | None = None, limit: Limit = 1000
) -> AlertsAnswer:
    """Alerts of one run, newest first."""
    run = store.runs.get_run(run_id, job=False, metrics=False)
    if run is None:
        raise run_not_found(run_id)
    check_project(who, Role.READ, run["project"], run_not_found(run_id))
    return {"alerts": store.alerts.list_alerts(run_id=run_id, state=state, limit=limit)}


@router.get("/alerts")
def list_alerts(
    store: StoreDep,
    who: Reader,
    state: AlertState | None = None,
    project: str | None = None,
    severity: Severity | None = None,
    limit: Limit = 500,
) -> AlertsAnswer:
    """Alerts across runs, newest first, optionally only those ``firing``, ``resolved`` or
    ``closed`` (when their run ended)."""
    seen = scoped(who, project)
    if isinstance(seen, NoProject):
        return {"alerts": []}
    project = seen
    alerts = store.alerts.list_alerts(state=state, project=project, severity=severity, limit=limit)
    return {"alerts": alerts}


class AckRequest(BaseModel):
    by: str | None = Field(default=None, max_length=200)


class SilenceRequest(BaseModel):
    duration_s: float = Field(default=3600.0, gt=0, le=30 * 86400)
    by: str | None = Field(default=None, max_length=200)


@router.post("/alerts/{alert_id}/ack")
async def acknowledge_alert(
    alert_id: str, engine: AlertsDep, store: StoreDep, who: Admin, body: AckRequest | None = None
) -> AlertRow:
    """Acknowledge an alert: someone is on it (it leaves the banner; it still resolves).
    Recorded as the token's name (``by`` only without auth)."""
    alert_for(store, who, alert_id, Role.ADMIN)
    alert = await engine.acknowledge(alert_id, _by(who, body.by if body else None))
    if alert is None:
        raise alert_not_found(alert_id)
    return alert


@router.post("/alerts/{alert_id}/silence")
async def silence_alert(
    alert_id: str,
    engine: AlertsDep,
    store: StoreDep,
    who: Admin,
    body: SilenceRequest | None = None,
) -> SilenceAnswer:
    """Silence the alert's rule and subject on its run for ``duration_s`` seconds: alerts
    are still recorded, but neither bannered nor notified."""
    body = body or SilenceRequest()
    alert_for(store, who, alert_id, Role.ADMIN)
    result = await engine.silence(alert_id, body.duration_s, _by(who, body.by))
    if result is None:
        raise alert_not_found(alert_id)
    alert, silence = result
    return {"alert": alert, "silence": silence}


@router.get("/rules")
def effective_rules(engine: AlertsDep, who: Reader, project: str | None = None) -> RulesAnswer:
    """The thresholds in force (defaults, the rules file, and ``project``'s overrides). A
    token of one project asking for another's gets the defaults, as for a project without
    overrides: it learns nothing of the others."""
    seen = scoped(who, project) if project else None
    rules = engine.rules.for_project(seen) if isinstance(seen, str) else engine.rules.defaults
    return {"project": project, "rules": rules.as_dict()}


def _by(who: Principal, said: str | None) -> str:
    """Who acted: the token's name; without auth, what the browser said, else ``local``."""
    return (said or LOCAL.name) if who is LOCAL else who.name
