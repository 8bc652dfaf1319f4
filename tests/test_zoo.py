"""A sample of the zoo (benchmarks/zoo.py): two real generated runs, one with a planted
learning-rate blow-up and one healthy, streamed to a real server and judged as the zoo
judges its hundreds."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import zoo
from harness import outcomes as sc
from harness.polling import wait_for
from harness.processes import ServerProcess
from trainvitals.protocol import Columns

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20

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


def test_a_regression_drawn_too_wide_is_found_at_its_first_steps(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wide weights put a regression's loss at 10^8 or more from its first step, and there it
    stays: only its level at chance, measured in the step on the batch's targets, tells."""
    monkeypatch.setattr(zoo, "STREAMS", tmp_path)
    spec = {**zoo.draw(np.random.default_rng(3), 0, ("bad_init",)), **SMALL}
    spec.update(data="regression", optimizer="rmsprop", lr=2.5e-4, strength=0.05)
    result = zoo.run_one(server, spec, 3)
    assert result.error is None and result.detected and result.diagnosed, result.alarms
    first = result.alarms[0]
    assert (first["rule"], first["step"]) == ("loss_above_chance", 20), result.alarms
    assert first["evidence"]["loss_start"] > 1e6 * first["evidence"]["loss_at_chance"]


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


def test_the_loss_is_lost_when_what_it_learned_is_given_back() -> None:
    """A run that learned an eighth of its start loss (2.29, its first 20 losses' median, to
    2.0), then gives it back a thousandth a step: its point of no return is where 90% of
    that is back (2.26), not where the loss is within 10% of its start (2.06), a fifth of it
    back."""
    steps = list(range(1, 701))
    loss = [2.3 - 0.3 * min(s, 300) / 300 + 0.001 * max(0, s - 300) for s in steps]
    found = sc.loss_lost(steps, [0.5 * s for s in steps], loss)
    assert found is not None and found[0] == 566, found  # 261 steps on, and 5 of the median's lag
    assert sc.loss_lost(steps, steps, [2.3 - 0.3 * s / 700 for s in steps]) is None
    # A recorded run judged again reads its point of no return as the harness reads it now.
    result = zoo.Judged("slow", {"kind": "label_noise", "at": 300}, 1.0, 0, steps=700)
    result.lost_at, result.lost_by = 307, "loss_back_at_start"
    zoo.lost_again(result, {"loss": (steps, steps, loss)})
    assert (result.lost_at, result.lost_by) == (566, "loss_back_at_start")
    zoo.lost_again(result, {"loss": (steps, steps, loss[:500])})
    assert (result.lost_at, result.lost_by) == (700, "last_step")


def test_the_report_says_which_goals_are_missed_and_by_which_classes() -> None:
    """The issue: where a goal is not met, the report says which classes miss it."""

    def run(kind: str, lead: int | None, detected: bool = True) -> zoo.Judged:
        spec = {"kind": kind, "seed": 0}
        return zoo.Judged(kind, spec, 1.0, 0, lead=lead, detected=detected, diagnosed=detected)

    results = [run("lr_sudden", 80), run("lr_growing", 120), run("label_noise", 10)]
    results += [run("label_noise", None, detected=False), run("healthy", None, detected=False)]
    figures = zoo.report(results, 0)
    goals = figures["goals"]
    assert goals["lead_learning_rate_blow_ups"] == {
        "value": 100.0, "goal": 50, "met": True, "classes_missing": []
    }  # fmt: skip
    assert goals["lead_gradual_divergences"]["met"] is False
    assert goals["recall"]["classes_missing"] == ["label_noise"]
    assert goals["healthy_false_alarms"]["met"] is True
    assert "goals missed: recall (label_noise)" in zoo.summary_line(figures)


def test_an_alarm_before_the_injection_is_not_the_failure_found() -> None:
    """Before its injection a failure run is a healthy one: the right rule firing there is
    no detection (and no lead); the report lists it."""
    spec = {"kind": "lr_sudden", "seed": 0, "at": 200}
    early = zoo.Judged("early", spec, 1.0, 0, lost_at=400)
    early.alarms = [{"rule": "loss_divergence", "step": 150, "severity": "warning"}]
    late = zoo.Judged("late", spec, 1.0, 0, lost_at=400)
    late.alarms = [{"rule": "grad_explosion", "step": 250, "severity": "warning"}]
    for result in (early, late):
        result.alarms[0]["evidence"] = {"lr": 1.0, "lr_first": 0.01}
        zoo.verdict(result)
    assert (early.detected, early.lead) == (False, None) and (late.detected, late.lead) == (
        True,
        150,
    )
    # A crash is raised at the process's end, whatever step the server gives it (none: 0).
    killed = zoo.Judged("killed", {"kind": "kill", "seed": 0, "at": 200}, 1.0, None, lost_at=199)
    killed.alarms = [{"rule": "crash", "step": 0, "severity": "critical", "evidence": {}}]
    zoo.verdict(killed)
    assert killed.detected
    figures = zoo.report([early, late, killed], 0)
    assert figures["alarms_before_injection"]["runs"] == 1
    assert figures["alarms_before_injection"]["alarms"][0]["alarms"] == [("loss_divergence", 150)]


def test_a_loop_of_fits_is_judged_as_the_server_judges_its_process() -> None:
    """Memory kept between fits and flat within each: the fits, judged as one process's runs,
    forecast the limit from the growth between them, at the process's steps."""
    fits, starts = [], []
    for fit in range(8):
        at, steps, samples = 1000.0 + 10 * fit, list(range(1, 41)), [0, 20, 40]
        level = float(300 * MiB + max(0, fit - 2) * 64 * MiB)  # from the fourth fit on, 64 MiB kept
        fits.append(
            {
                "loss": Columns(steps, [at + 0.2 * s for s in steps], [1.0] * 40),
                "host/limit": Columns(samples, [at + 0.2 * s for s in samples], [float(2**30)] * 3),
                "host/working_set": Columns(samples, [at + 0.2 * s for s in samples], [level] * 3),
            }
        )
        starts.append(40 * fit)

    fits.append({})  # the process killed as its next fit began, before its first point
    starts.append(40 * 8)
    forecast = zoo.first_alarms(fits, starts)["oom_forecast"]
    assert forecast.evidence["trend"] == "between_fits", forecast
    assert "more kept after each of the last" in forecast.message
    assert forecast.step > 3 * 40  # the process's steps, in a fit after the leak began
    assert zoo.differences(fits, starts, None, 0) == []


def test_the_competing_load_shares_the_runs_cpu_and_ends_with_it() -> None:
    """Contention's busy processes run on the CPU of the process that started them, and end
    when it does, however it ends (here ``os._exit``: nothing of its own stops them)."""
    cpu = min(os.sched_getaffinity(0))
    code = (
        f"import os, sys; sys.path.insert(0, {str(ROOT)!r}); os.sched_setaffinity(0, {{{cpu}}})\n"
        "from benchmarks import zoo\n"
        "print(*[hog.pid for hog in zoo.competing(2)], flush=True)\n"
        "sys.stdin.read()\n"
        "os._exit(0)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert run.stdout is not None and run.stdin is not None
    hogs = [int(pid) for pid in run.stdout.readline().split()]
    try:
        assert len(hogs) == 2
        wait_for(lambda: all(os.sched_getaffinity(p) == {cpu} for p in hogs), timeout=10)
    finally:
        run.stdin.close()
        run.wait(timeout=30)

    def running(pid: int) -> bool:
        try:  # a zombie (the state after the name's parentheses: Z) has ended
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    wait_for(lambda: not any(running(p) for p in hogs), timeout=10, what="the load to end")
