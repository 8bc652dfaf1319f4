"""Many runs written straight into a database through the server's own storage, for the
dashboard's tests and benchmark: ten thousand runs through the agent would take minutes."""

from __future__ import annotations

from collections.abc import Sequence

from trainvitals.protocol import Columns
from trainvitals.server.storage import RunEnd
from trainvitals.server.store import Store

#: How the seeded runs end, in turn: finished, crashed, finished, lost.
ENDINGS = ("completed", "exception", "completed", "heartbeat_lost")


def seed_runs(
    db: str,
    count: int,
    projects: Sequence[str] = ("vision", "nlp"),
    steps: int = 0,
    started_at: float = 1_700_000_000.0,
    also: Sequence[str] = (),
) -> list[str]:
    """``count`` ended runs named ``run-00000``... (run ``i`` started ``i`` seconds after
    ``started_at``, project ``projects[i % len]``, config ``{"lr": ..., "batch": ...}``), each
    with ``steps`` points of ``loss`` (step ``s`` at ``s`` seconds after its start) and of each
    series named in ``also`` (the ``k``-th: ``k + 2`` times the loss). Returns their ids,
    oldest first."""
    store = Store(db)
    store.create_schema()
    ids = [f"seed{i:06d}" for i in range(count)]
    try:
        with store.transaction() as work:
            for i, run_id in enumerate(ids):
                at = started_at + i
                hello = {
                    "run_id": run_id,
                    "project": projects[i % len(projects)],
                    "name": f"run-{i:05d}",
                    "config": {"lr": round(0.001 * (1 + i % 7), 4), "batch": 32 * (1 + i % 3)},
                    "host": f"node{i % 5}",
                    "pid": 1000 + i,
                    "started_at": at,
                    "env": {},
                }
                store.runs.open_run(work, {**hello, "run_secret": run_id}, now=at)
                if steps:
                    points = range(1, steps + 1)
                    times = [at + s for s in points]
                    losses = [1.0 / (s + i % 7) for s in points]
                    columns = {"loss": Columns(list(points), times, losses)}
                    for k, name in enumerate(also):
                        columns[name] = Columns(list(points), times, [(k + 2) * v for v in losses])
                    store.series.add_points(work, run_id, 1, columns, now=at + steps)
                reason = ENDINGS[i % len(ENDINGS)]
                store.runs.end_run(work, run_id, 2, RunEnd(reason, at + steps + 1, None))
    finally:
        store.dispose()
    return ids
