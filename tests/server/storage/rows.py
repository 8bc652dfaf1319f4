"""What the storage tests feed: a hello as the ingest session hands it to storage."""

from __future__ import annotations

from typing import Any

from trainvitals.server.store import Store


def hello(run_id: str, started_at: float = 1000.0, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "project": "proj",
        "name": f"name-{run_id}",
        "config": {"lr": 0.1},
        "host": "h",
        "pid": 42,
        "started_at": started_at,
        "env": {"python": "3.11"},
        **extra,
    }


def job_of(store: Store, run_id: str) -> str:
    run = store.runs.get_run(run_id)
    assert run is not None and run["job_id"]
    return str(run["job_id"])
