"""Shared state of the app and the FastAPI dependencies that hand it to routes."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from starlette.requests import HTTPConnection

from trainvitals.server.alerts import AlertEngine
from trainvitals.server.connections import OpenRuns, OpenTokens
from trainvitals.server.live import Hub
from trainvitals.server.liveness import Liveness
from trainvitals.server.metrics import Metrics
from trainvitals.server.notify import NotifyConfig
from trainvitals.server.quotas import Quotas
from trainvitals.server.settings import Settings
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer


@dataclass
class AppState:
    settings: Settings
    store: Store
    writer: Writer
    hub: Hub
    liveness: Liveness
    alerts: AlertEngine
    notify: NotifyConfig
    quotas: Quotas
    metrics: Metrics
    #: The agent connections open on this process, by run (a watchdog waits for them).
    open_runs: OpenRuns = field(default_factory=OpenRuns)
    #: Every websocket open on this process, by its token (closed when that is revoked).
    open_tokens: OpenTokens = field(default_factory=OpenTokens)
    #: Websockets accepted and still open on this process (bounded by ``max_websockets``).
    websockets: int = 0
    #: Exports streaming now (bounded by ``max_exports``); made with the app's state.
    exports: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(1)
    )


def get_state(connection: HTTPConnection) -> AppState:
    state: AppState = connection.app.state.trainvitals
    return state


def get_store(request: Request) -> Store:
    return get_state(request).store


def get_alerts(request: Request) -> AlertEngine:
    return get_state(request).alerts


StateDep = Annotated[AppState, Depends(get_state)]
AlertsDep = Annotated[AlertEngine, Depends(get_alerts)]
StoreDep = Annotated[Store, Depends(get_store)]


def run_not_found(run_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"No run with id {run_id!r}")


def alert_not_found(alert_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"No alert with id {alert_id!r}")
