"""Build the FastAPI application."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from trainvitals import __version__
from trainvitals.detect import RulesConfig, load_rules
from trainvitals.protocol import EndReason
from trainvitals.server import errors
from trainvitals.server.alerts import AlertEngine
from trainvitals.server.broker import Broker
from trainvitals.server.compactor import Compactor
from trainvitals.server.connections import OpenTokens
from trainvitals.server.deps import AppState
from trainvitals.server.guard import RequestGuard, allowed_hosts
from trainvitals.server.leases import Leases
from trainvitals.server.live import Hub
from trainvitals.server.liveness import Liveness
from trainvitals.server.metrics import Metrics
from trainvitals.server.notify import Notifier, NotifyConfig, load_notify
from trainvitals.server.quotas import Caps, Quotas, TeamCounts
from trainvitals.server.routes import api, metrics, notify, session, streams, tokens, web
from trainvitals.server.settings import Settings
from trainvitals.server.store import Store
from trainvitals.server.writer import Writer, WriterState


def create_app(settings: Settings | None = None) -> FastAPI:
    """The trainvitals server as an ASGI app.

    Example:
        ```python
        import uvicorn
        from trainvitals.server import Settings, create_app

        uvicorn.run(create_app(Settings(db="runs.db")), port=8600)
        ```
    """
    settings = settings or Settings()
    # A bad rules file stops the server before it starts, with the setting named.
    rules = load_rules(settings.rules) if settings.rules else RulesConfig()
    channels = load_notify(settings.notify) if settings.notify else NotifyConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.db)
        store.create_schema()
        gauges = Metrics()
        loop = asyncio.get_running_loop()
        recovered: list[Callable[[], None]] = []

        def writer_state(state: WriterState) -> None:  # on the writer's thread
            gauges.writer_state.set(state)
            if state is WriterState.OK:
                for listener in recovered:
                    loop.call_soon_threadsafe(listener)

        writer = Writer(
            store,
            on_commit=gauges.transaction_seconds.observe,
            on_error=gauges.storage_error,
            on_state=writer_state,
            patience=settings.storage_patience,
        )
        broker = Broker(settings.broker) if settings.broker else None
        open_tokens = OpenTokens()
        hub = Hub(
            settings.live_queue_size,
            settings.runs_push_interval,
            settings.live_queue_bytes,
            broker,
            on_revoked=open_tokens.revoked,
        )
        gauges.queue_depth.set_function(lambda: writer.queue_depth)
        gauges.browsers.set_function(lambda: hub.browsers)
        hub.start()
        notifier = None
        if channels.channels:
            notifier = Notifier(
                channels, store.outbox, writer, settings.public_url, settings.notify_lease
            )
            await notifier.start()
        leases = Leases(store.leases, writer, settings.lease)
        alerts = AlertEngine(store, writer, hub, rules, leases, notifier)
        await alerts.start()
        liveness = Liveness(
            store.runs,
            writer,
            hub,
            settings.lost_after,
            on_lost=lambda run_id, when: alerts.ended(run_id, EndReason.HEARTBEAT_LOST, when),
            leases=leases,
        )
        await liveness.start()
        # Agents could not be heard while nothing could be stored: no run is lost for it.
        recovered.append(lambda: liveness.resume(time.time()))
        compactor = Compactor(
            store,
            writer,
            hub,
            settings.compact_interval,
            thin_after=settings.retention,
            delete_archived_after=settings.archived_retention,
            thin_points=settings.thin_points,
            leases=leases,
        )
        await compactor.start()
        # Replicas of one team count each token's caps together (docs/scaling.md).
        team = TeamCounts(settings.broker) if settings.broker else None
        if team is not None:
            await team.start()
        app.state.trainvitals = AppState(
            settings=settings,
            store=store,
            writer=writer,
            hub=hub,
            liveness=liveness,
            alerts=alerts,
            notify=channels,
            quotas=Quotas(
                Caps(
                    settings.max_connections,
                    settings.max_runs_per_minute,
                    settings.max_series_per_run,
                    settings.max_bytes_per_day,
                ),
                team=team,
            ),
            metrics=gauges,
            open_tokens=open_tokens,
            exports=threading.BoundedSemaphore(settings.max_exports),
        )
        # What start-up built (modules, classes, routes, the detectors' code) lives as long
        # as the process: out of the collector's sight, a full collection walks only what
        # serving made: under load, a third shorter (docs/scaling.md).
        gc.collect()
        gc.freeze()
        gauges.watch_pauses()
        try:
            yield
        finally:
            writer.stopping()  # what stops next does not wait out a database outage
            await gauges.stop_watching()
            await compactor.stop()
            if team is not None:
                await team.stop()
            await liveness.stop()
            await alerts.stop()
            if notifier is not None:
                await notifier.stop()
            await hub.stop()
            writer.close()
            store.dispose()

    # With auth required the API's description is a reader's, as the API is (web.guarded_docs).
    public_docs = not settings.auth_required
    app = FastAPI(
        title="trainvitals",
        version=__version__,
        lifespan=lifespan,
        openapi_url="/openapi.json" if public_docs else None,
        docs_url="/docs" if public_docs else None,
        redoc_url="/redoc" if public_docs else None,
    )
    if not public_docs:
        web.guarded_docs(app)
    errors.install(app)
    app.add_middleware(
        RequestGuard,
        hosts=allowed_hosts(
            settings.host, settings.public_url, (settings.allowed_hosts or "").split(",")
        ),
        public_url=settings.public_url,
        max_body_bytes=settings.max_body_bytes,
        local_only=not settings.auth_required,
    )
    app.include_router(api.router)
    app.include_router(metrics.router)
    app.include_router(notify.router)
    app.include_router(session.router)
    app.include_router(streams.router)
    app.include_router(tokens.router)
    app.include_router(web.router)
    # follow_symlink: an editable install links the package's files rather than copying them.
    app.mount("/static", StaticFiles(directory=web.WEB_DIR, follow_symlink=True), name="static")
    return app
