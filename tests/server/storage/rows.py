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


def alert_row(alert_id: str, run_id: str, name: str | None = None) -> dict[str, Any]:
    """A firing critical alert of ``run_id`` as storage keeps it."""
    return {
        "id": alert_id,
        "run_id": run_id,
        "project": "proj",
        "run_name": name or f"name-{run_id}",
        "rule": "nonfinite",
        "subject": "",
        "severity": "critical",
        "state": "firing",
        "message": "NaN in the loss",
        "hint": "lower the learning rate",
        "evidence": {"loss": "NaN"},
        "step": 1,
        "time": 2.0,
        "updated_time": 2.0,
        "resolved_time": None,
        "closed_time": None,
        "closed_reason": None,
        "count": 1,
        "acknowledged_at": None,
        "acknowledged_by": None,
        "silenced_until": None,
    }
