"""``/api/v1`` REST routes, a module per concern: runs (:mod:`.runs`), their series and
exports (:mod:`.series`), alerts and rules (:mod:`.alerts`)."""

from __future__ import annotations

from fastapi import APIRouter

from trainvitals.server.routes import alerts, runs, series

router = APIRouter()
for _concern in (runs, series, alerts):  # in this order: the OpenAPI document's as before
    router.include_router(_concern.router)
