"""A sample of the zoo (benchmarks/zoo.py): two real generated runs, one with a planted
learning-rate blow-up and one healthy, streamed to a real server and judged as the zoo
judges its hundreds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import zoo
from harness.processes import ServerProcess

#: A small MLP on the digits under plain SGD, 300 steps: the cheapest recipe the zoo draws.
SMALL = {"data": "digits", "arch": "mlp", "optimizer": "sgd", "lr": 0.05,
         "schedule": "constant", "batch": 32, "steps": 300, "mixed": False}  # fmt: skip


def test_a_small_zoo_reports_a_planted_learning_rate_blow_up(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zoo, "STREAMS", tmp_path)
    rng = np.random.default_rng(3)
    blow_up = {**zoo.draw(rng, 0, ("lr_sudden",)), **SMALL, "at": 150, "strength": 1.0}
    healthy = {**zoo.draw(rng, 1, ("healthy",)), **SMALL}
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda spec: zoo.run_one(server, spec, 3), [blow_up, healthy]))
    figures: dict[str, Any] = zoo.report(results, 3)

    assert figures["runs"] == 2 and not figures["errors"], figures["errors"]
    failures, calm = figures["failures"], figures["healthy"]
    assert set(failures["per_class"]) == {"lr_sudden"}
    assert failures["recall"] == 1.0, figures["misses"]
    assert failures["per_class"]["lr_sudden"]["median_lead_steps"] is not None
    assert figures["diagnosis_accuracy"] == 1.0, figures["misses"]
    assert calm == {"runs": 1, "false_alarm_rate": 0.0, "false_alarms": []}
    assert figures["determinism"]["runs_differing"] == 0, figures["determinism"]
    assert figures["seconds_per_run"] > 0
    assert "recall 100%" in zoo.summary_line(figures)

    # Recorded, the runs are judged again offline (``--judge``) to the same verdicts.
    again = {r.name: r for r in zoo.rejudged(tmp_path)}
    for result in results:
        redone = again[result.name]
        assert (redone.detected, redone.diagnosed, redone.lead, redone.alarms) == (
            result.detected,
            result.diagnosed,
            result.lead,
            result.alarms,
        ), result.name
