"""Storage of runs, their series and alerts, on SQLite or PostgreSQL through SQLAlchemy Core.

- :mod:`~trainvitals.server.storage.schema`: the tables, the database URL and engine, and
  the upgrade of older databases;
- :mod:`~trainvitals.server.storage.runs`: runs, their jobs and events;
- :mod:`~trainvitals.server.storage.series`: the points of their series;
- :mod:`~trainvitals.server.storage.alerts`: alerts and silences.

:class:`~trainvitals.server.store.Store` holds them together, with the notify outbox.
"""

from __future__ import annotations

from trainvitals.server.storage.alerts import AlertStore
from trainvitals.server.storage.runs import RUN_FIELDS, RunEnd, RunStore
from trainvitals.server.storage.schema import database_url
from trainvitals.server.storage.series import SeriesStore

__all__ = ["RUN_FIELDS", "AlertStore", "RunEnd", "RunStore", "SeriesStore", "database_url"]
