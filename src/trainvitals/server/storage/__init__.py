"""Storage of runs, their series and alerts, on SQLite or PostgreSQL through SQLAlchemy Core.

- :mod:`~trainvitals.server.storage.schema`: the tables, the database URL and engine (their
  migrations: :mod:`trainvitals.server.migrations`);
- :mod:`~trainvitals.server.storage.runs`: runs, their jobs and events (what they are read
  as: :mod:`~trainvitals.server.storage.run_rows`; which runs a query reads:
  :mod:`~trainvitals.server.storage.run_queries`; their status changes:
  :mod:`~trainvitals.server.storage.run_moves`);
- :mod:`~trainvitals.server.storage.series`: the points of their series;
- :mod:`~trainvitals.server.storage.alerts`: alerts and silences;
- :mod:`~trainvitals.server.storage.unit_of_work`: the writes of one transaction, and when
  they are made.

:class:`~trainvitals.server.store.Store` holds them together, with the notify outbox.
"""

from __future__ import annotations

from trainvitals.server.storage.alerts import (
    AlertRow,
    AlertStore,
    RuleStanding,
    RunHealth,
    Silence,
)
from trainvitals.server.storage.run_queries import RunFilter
from trainvitals.server.storage.run_rows import (
    Job,
    JobMember,
    ListedRun,
    MetricSummary,
    OpenedRun,
    RunDetail,
    RunEdit,
    RunEnd,
    RunEvent,
    RunRow,
    RunSummary,
    run_summary,
)
from trainvitals.server.storage.runs import RunStore
from trainvitals.server.storage.schema import database_url, shown_database
from trainvitals.server.storage.series import SeriesStore
from trainvitals.server.storage.unit_of_work import UnitOfWork, transaction

__all__ = [
    "AlertRow",
    "AlertStore",
    "Job",
    "JobMember",
    "ListedRun",
    "MetricSummary",
    "OpenedRun",
    "RuleStanding",
    "RunDetail",
    "RunEdit",
    "RunEnd",
    "RunEvent",
    "RunFilter",
    "RunHealth",
    "RunRow",
    "RunStore",
    "RunSummary",
    "SeriesStore",
    "Silence",
    "UnitOfWork",
    "database_url",
    "run_summary",
    "shown_database",
    "transaction",
]
