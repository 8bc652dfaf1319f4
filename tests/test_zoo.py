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


def test_failures_that_left_no_mark_are_not_counted() -> None:
    """Label noise can take away only what was learned: on a loss that never left its
    start, the run is a healthy one that does not learn, and its "point of no return" noise."""
    steps = list(range(1, 301))

    def stream(loss: Any) -> dict[str, Any]:
        return {"loss": (steps, [0.01 * s for s in steps], [loss(s) for s in steps])}

    flat = stream(lambda s: 2.3 + 0.05 * np.sin(s))
    learned = stream(lambda s: 2.3 * np.exp(-s / 60) + 0.2)
    noise = {"kind": "label_noise", "at": 150}
    assert zoo.without_effect(noise, flat)
    assert not zoo.without_effect(noise, learned)
    assert not zoo.without_effect({"kind": "lr_sudden", "at": 150}, flat)  # it blows up
    # Weights drawn wide that a network's normalisation tamed: it starts at chance and learns.
    bad_init, chance = {"kind": "bad_init", "at": 1}, {"loss_at_chance": {"value": 2.3026}}
    assert zoo.without_effect(bad_init, learned, chance)
    assert not zoo.without_effect(bad_init, stream(lambda s: 40.0 * np.exp(-s / 60)), chance)
    assert not zoo.without_effect(bad_init, learned)  # a regression: no chance to start at
    result = zoo.Judged("flat", {**noise, "seed": 0}, 1.0, 0, no_effect=True)
    figures = zoo.report([result], 0)
    assert figures["without_effect"] == ["flat"] and figures["failures"]["runs"] == 0
