"""Detection, lead time and false alarms, measured on real runs in one go:

1. every failure scenario of ``trainvitals demo`` at the demo's pace (0.02 s of extra time a
   step, so the seconds resemble a small real job): which alert fired, at which step, and how
   many steps and seconds before the point of no return (the first NaN/Inf, the loss back at
   its start, the OOM kill); for the hang, how long after the last step the stall was
   reported (default 30 s threshold);
2. the healthy shapes of the test suite, each over ``--seeds`` seeds (0, 1, 2 by default:
   the weights' initialisation, the batches' order, the data a shape draws), plus the healthy
   demo as many times: per shape, its runs, steps and warning or critical alerts (must be 0).

The leak runs inside a memory cgroup (needs root) and is really OOM-killed.

    python benchmarks/scenarios.py [--pace 0.02] [--skip leak,hang] [--seeds 3]
        [--shapes gan,finetune-unfrozen] [--healthy-only]
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

from harness import healthy_runs
from harness import outcomes as sc
from harness.processes import ServerProcess, in_cgroup, memory_cgroup, run_series

GRAD = "grad/global_norm"
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


def steps_of(server: ServerProcess, result: sc.Outcome) -> int:
    """How many steps a run recorded (its gradient norm's: every shape has one, not every one
    a ``loss``)."""
    return len(run_series(server, result.run["id"], GRAD)[GRAD]["step"])


def healthy(server: ServerProcess, shapes: list[str], seeds: int, pace: float, tmp: Path) -> None:
    """Every healthy shape over ``seeds`` seeds: one table row a shape, then each false alarm."""
    print("\n| healthy shape | runs | steps | warning/critical alerts | info alerts |")
    print("| --- | --- | --- | --- | --- |")
    runs = steps = alarms = 0
    false: list[str] = []
    for shape in shapes:
        outcomes: list[sc.Outcome] = []
        for seed in range(seeds):
            if shape == "demo":  # the demo's CNN, unseeded: three runs are three draws
                name = f"healthy-{seed}"
                sc.run_scenario(server, "healthy", "--epochs", "20", "--pace", str(pace), name=name)
                outcomes.append(sc.outcome(server, "healthy", name))
            else:
                outcomes += healthy_runs.run_healthy(server, shape, tmp, seed)
        shape_steps = sum(steps_of(server, r) for r in outcomes)
        shape_alarms = [a for r in outcomes for a in r.alarms()]
        infos = sum(len(r.alerts) for r in outcomes) - len(shape_alarms)
        false += [f"{a['rule']} on {r.run['name']} at step {a['step']}: {a['message']}"
                  for r in outcomes for a in r.alarms()]  # fmt: skip
        runs, steps, alarms = runs + len(outcomes), steps + shape_steps, alarms + len(shape_alarms)
        print(f"| {shape} | {len(outcomes)} | {shape_steps:,} | {len(shape_alarms)} | {infos} |",
              flush=True)  # fmt: skip
    print(f"| all | {runs} | {steps:,} | {alarms} | |")
    for line in false:
        print(f"false alarm: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--skip", default="", help="comma-separated scenarios to leave out")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per healthy shape (3)")
    parser.add_argument("--shapes", default="", help="comma-separated healthy shapes (all)")
    parser.add_argument("--healthy-only", action="store_true", help="no failure scenario")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if args.healthy_only:
        skip |= {scenario for scenario, _, _ in FAILURES}
    shapes = list(filter(None, args.shapes.split(","))) or ["demo", *sorted(healthy_runs.HEALTHY)]
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
            healthy(server, shapes, args.seeds, args.pace, Path(tmp))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
