"""The scenario suite's parts, shared by tests/e2e/test_scenarios.py (which asserts) and
benchmarks/scenarios.py (which prints the detection figures of docs/benchmarks.md).

A failure scenario is ``trainvitals demo --scenario NAME`` in a subprocess at full speed;
:func:`outcome` reads back from the server which alerts it raised, and where the training
crossed its point of no return, to give the lead time. The healthy runs, each of which must
raise no warning or critical alert, are :mod:`harness.healthy_runs`.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.polling import wait_for
from harness.processes import ServerProcess, demo_command, run_series
from trainvitals.client.answers import Alert
from trainvitals.json_types import Json
from trainvitals.server.storage import RunSummary

ALARMS = ("warning", "critical")
#: Lines for the end of the test session's report (see conftest.py): each scenario's lead.
REPORT: list[str] = []
#: Stall threshold floor for the hang scenario's agent, so the suite doesn't wait 30 s.
HANG_FLOOR = 3.0


def run_scenario(
    server: ServerProcess,
    scenario: str,
    *extra: str,
    prefix: list[str] | None = None,
    env: dict[str, str] | None = None,
    name: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the scenario's demo to its end (``prefix``: a command that wraps it, such as
    entering a memory cgroup; ``env``: variables over the test defaults; ``name``: the run's
    name, by default the scenario's)."""
    env = {**os.environ, "TRAINVITALS_STALL_FLOOR": str(HANG_FLOOR), **(env or {})}
    return subprocess.run(
        [
            *(prefix or []),
            *demo_command(server, name or scenario, "--scenario", scenario, "--pace", "0", *extra),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@dataclass
class Outcome:
    """What the server made of one run."""

    scenario: str
    run: RunSummary
    alerts: list[Alert]
    #: Where training was lost: (step, time), or None when it never was.
    lost_at: tuple[int, float] | None = None

    def alarms(self) -> list[Alert]:
        return [a for a in self.alerts if a["severity"] in ALARMS]

    def first(self, rule: str) -> Alert | None:
        fired = [a for a in self.alarms() if a["rule"] == rule]
        return min(fired, key=lambda a: a["time"]) if fired else None

    def lead(self, rule: str) -> tuple[int, float] | None:
        """Steps and seconds from the rule's first alarm to the point of no return."""
        alert = self.first(rule)
        if alert is None or self.lost_at is None:
            return None
        return self.lost_at[0] - alert["step"], self.lost_at[1] - alert["time"]


def outcome(server: ServerProcess, scenario: str, name: str | None = None) -> Outcome:
    """The ended run named ``name`` (default: the scenario's name), its alerts and its point of
    no return."""
    runs = server.get("/api/v1/runs")["runs"]
    run = wait_for(
        lambda: next(
            (
                r
                for r in server.get("/api/v1/runs")["runs"]
                if r["name"] == (name or scenario) and r["status"] not in ("running", "stalled")
            ),
            None,
        ),
        timeout=20,
        what=f"the {scenario} run to end (runs: {[(r['name'], r['status']) for r in runs]})",
    )
    alerts = server.get(f"/api/v1/runs/{run['id']}/alerts")["alerts"]
    lost = _POINT_OF_NO_RETURN.get(scenario)
    return Outcome(scenario, run, alerts, lost(server, run) if lost else None)


def first_nonfinite(server: ServerProcess, run: RunSummary) -> tuple[int, float] | None:
    """The first step with a NaN/Inf anywhere (a count, or the loss or gradient norm itself,
    which the API gives as null): after it the weights are poisoned."""
    counts = ("nonfinite/loss", "nonfinite/grads", "nonfinite/inputs")
    series = run_series(server, run["id"], *counts, "loss", "grad/global_norm")
    hits = [
        (step, time)
        for name, s in series.items()
        for step, time, value in zip(s["step"], s["time"], s["value"], strict=True)
        if (value is None or not math.isfinite(value)) or (name in counts and value)
    ]
    return min(hits) if hits else None


def trailing_median(values: np.ndarray, n: int = 11) -> np.ndarray:
    """Each value's median with the ``n - 1`` before it (fewer at the start): the loss
    smoothed as the points of no return read it."""
    return np.array([np.median(values[max(0, i - n + 1) : i + 1]) for i in range(len(values))])


def loss_back_at_start(server: ServerProcess, run: RunSummary) -> tuple[int, float] | None:
    """The run's loss back at its start (:func:`loss_lost`), read from the server."""
    loss = run_series(server, run["id"], "loss")["loss"]
    return loss_lost(loss["step"], loss["time"], loss["value"])


def loss_lost(
    steps: Sequence[float], times: Sequence[float], values: Sequence[float | None]
) -> tuple[int, float] | None:
    """The first step after the loss's best at which its running median has given back 90%
    of what it learned from where training started (the median of its first 20 losses):
    everything learned is lost. Measured on what it learned, not on the start alone: a run
    that learned an eighth of its start loss is back within 10% of it having given back a
    fifth of that."""
    loss = np.asarray(values, dtype=float)
    smooth = trailing_median(loss)
    start = float(np.median(loss[:20]))
    best = int(np.argmin(smooth))
    lost = np.flatnonzero(smooth[best:] >= start - 0.1 * (start - smooth[best]))
    if not len(lost):
        return None
    i = best + int(lost[0])
    return int(steps[i]), float(times[i])


def killed(server: ServerProcess, run: RunSummary) -> tuple[int, float] | None:
    """The process's death (the OOM kill): its last step, at its end (step 0 for a run
    killed before its first step: a loop's fit killed as it began, whose process's last
    step is the fit before's)."""
    last, ended = run["last_step"], run["ended_at"]
    assert ended is not None, run
    return last or 0, ended


def evidence(alert: Alert, *path: str) -> Json:
    """The value at ``path`` in an alert's evidence (``"autopsy", "origin"``): each rule's
    evidence has a shape of its own, so each step is checked to be an object."""
    value: Json = alert["evidence"]
    for key in path:
        assert isinstance(value, dict), (path, alert["evidence"])
        value = value[key]
    return value


def _stuck(server: ServerProcess, run: RunSummary) -> tuple[int, float] | None:
    """The last step before the generator blocked: the moment the run hung (the lead is then
    negative: the time the stall took to be reported)."""
    times = run_series(server, run["id"], "step_time")["step_time"]
    from trainvitals.demo.scenarios import HANG_STEP

    before = [(s, t) for s, t in zip(times["step"], times["time"], strict=True) if s < HANG_STEP]
    return max(before) if before else None


_POINT_OF_NO_RETURN: dict[str, Callable[[ServerProcess, RunSummary], tuple[int, float] | None]] = {
    "nan-input": first_nonfinite,
    "explode": first_nonfinite,
    "diverge": loss_back_at_start,
    "leak": killed,
    "hang": _stuck,
}


def describe(result: Outcome, rule: str) -> str:
    """One line: when the rule fired and how far ahead of the loss."""
    alert = result.first(rule)
    if alert is None:
        return f"{result.scenario}: {rule} did not fire"
    lead = result.lead(rule)
    where = f"{result.scenario}: {rule} ({alert['severity']}) at step {alert['step']}"
    if lead is None:
        return where
    steps, seconds = lead
    if steps < 0 or seconds < 0:
        return f"{where}, {-seconds:.1f} s after the run stopped at step {result.lost_at[0]}"  # type: ignore[index]
    return f"{where}: {steps} steps, {seconds:.1f} s before the point of no return"
