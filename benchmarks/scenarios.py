"""Detection, lead time and false alarms, measured on real runs in one go:

1. every failure scenario of ``trainvitals demo`` at the demo's pace (0.02 s of extra time a
   step, so the seconds resemble a small real job): which alert fired, at which step, and how
   many steps and seconds before the point of no return (the first NaN/Inf, the loss back at
   its start, the OOM kill); for the hang, how long after the last step the stall was
   reported (default 30 s threshold);
2. the healthy shapes of the test suite plus the healthy demo: warning and critical alerts
   raised (must be 0).

The leak runs inside a memory cgroup (needs root) and is really OOM-killed.

    python benchmarks/scenarios.py [--pace 0.02] [--skip leak,hang]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import outcomes as sc
from harness.processes import ServerProcess, in_cgroup, memory_cgroup

#: The scenario, its rule, and the demo's extra arguments.
FAILURES = [
    ("nan-input", "nonfinite", []),
    ("explode", "grad_explosion", []),
    ("diverge", "loss_divergence", []),
    ("vanishing", "grad_vanishing", ["--epochs", "10"]),
    ("hang", "stall", ["--epochs", "5", "--hang-for", "40"]),
    ("leak", "oom_forecast", ["--time-to-oom", "120"]),
]


def failure(server: ServerProcess, scenario: str, extra: list[str], pace: float) -> sc.Outcome:
    args = [*extra, "--pace", str(pace)]
    if scenario == "leak":
        with memory_cgroup(1200 * 2**20) as group:
            sc.run_scenario(server, scenario, *args, prefix=in_cgroup(group))
    else:
        # The hang waits for the agent's real default threshold (30 s), not the tests' 3 s.
        env = {"TRAINVITALS_STALL_FLOOR": "30"} if scenario == "hang" else {}
        sc.run_scenario(server, scenario, *args, env=env)
    return sc.outcome(server, scenario)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--skip", default="", help="comma-separated scenarios to leave out")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "scenarios.db"))
        try:
            print("| scenario | alert | fired at step | lead (steps) | lead (s) | other alarms |")
            print("| --- | --- | --- | --- | --- | --- |")
            for scenario, rule, extra in FAILURES:
                if scenario in skip:
                    continue
                result = failure(server, scenario, extra, args.pace)
                alert = result.first(rule)
                lead = result.lead(rule)
                others = sorted({a["rule"] for a in result.alarms()} - {rule})
                print(
                    f"| {scenario} | {rule} ({alert['severity'] if alert else 'missed'}) "
                    f"| {alert['step'] if alert else '-'} "
                    f"| {lead[0] if lead else '-'} | {f'{lead[1]:.1f}' if lead else '-'} "
                    f"| {', '.join(others) or 'none'} |",
                    flush=True,
                )
            runs = alarms = 0
            sc.run_scenario(server, "healthy", "--epochs", "20", "--pace", str(args.pace))
            outcomes = [sc.outcome(server, "healthy")]
            for shape in sorted(sc.HEALTHY):
                outcomes += sc.run_healthy(server, shape, Path(tmp))
            for result in outcomes:
                runs += 1
                alarms += len(result.alarms())
                for alert in result.alarms():
                    print(f"false alarm on {result.run['name']}: {alert['message']}")
            steps = sum(int(r.run["last_step"] or 0) for r in outcomes)
            print(f"\nhealthy runs: {runs}, {steps} steps, warning/critical alerts: {alarms}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
