"""Candidate early warnings of a learning-rate blow-up, measured on recorded streams.

Issue #16 asks for a warning at least 50 steps before the first non-finite loss or weights on
a learning-rate warm-up that never ends, with no new false alarm. This records real runs
through a real server, then scores candidate signals offline:

- the blow-ups: the demo's ``explode`` (SGD, LR x1.005 a step, two tanh layers, MSE on
  digits), the same model on other seeds and at x1.006, and a six-layer ReLU MLP at x1.006;
- the healthy suite of ``harness/healthy_runs.py`` and the demo's healthy run.

Each signal's threshold is the highest value any healthy run reaches after its first 100
steps (no new false alarm, by construction); a blow-up's lead is the number of steps from the
first step (after 200) above that threshold to its first non-finite value, and from the step
from which it stays above until then (``first / held``): a first crossing far ahead that falls
back is noise, not a precursor. The last column is what the server raises today: its first
warning or critical alert, and its lead.

With ``--today`` only the blow-ups are recorded, and only the last column is printed.

    python benchmarks/early_warning.py [--today]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from harness import healthy_runs
from harness import outcomes as sc
from harness.processes import ServerProcess, run_series

WINDOW = 25  # steps in a rolling window
BASELINE = (300, 50)  # a signal's baseline: its median from 300 to 50 steps back
#: The blow-ups: (seed, LR growth a step, activation, hidden layers).
RAMPS = [(1, 1.005, "tanh", 2), (2, 1.005, "tanh", 2), (0, 1.006, "tanh", 2),
         (1, 1.006, "tanh", 2), (0, 1.006, "relu", 6), (1, 1.006, "relu", 6),
         (2, 1.006, "relu", 6)]  # fmt: skip
Signal = tuple[np.ndarray, np.ndarray]  # steps, values


def ramp(server: ServerProcess, name: str, seed: int, growth: float, act: str, depth: int) -> None:
    import keras

    import trainvitals
    from trainvitals.demo.scenarios import _Climb, digits

    (x, y), _ = digits()
    keras.utils.set_random_seed(seed)
    hidden = [keras.layers.Dense(64, activation=act) for _ in range(depth)]
    model = keras.Sequential([keras.Input((64,)), *hidden, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(_Climb(1e-3, 0, growth)), loss="mse")
    vitals = trainvitals.VitalsCallback(server=server.url, project="ramps", run_name=name)
    flat = x.reshape(len(x), -1)
    model.fit(flat, y.astype("float32"), batch_size=32, epochs=40, verbose=0, callbacks=[vitals])


def streams(server: ServerProcess, outcome: sc.Outcome) -> dict[str, np.ndarray]:
    """The run's loss, gradient norm and learning rate, cut at its first non-finite step."""
    got = run_series(server, outcome.run["id"], "loss", "grad/global_norm", "lr")
    stop = outcome.lost_at[0] if outcome.lost_at else None
    out = {"step": np.asarray(got["loss"]["step"])}
    for name, key in (("loss", "loss"), ("grad/global_norm", "gn"), ("lr", "lr")):
        values = got.get(name, {}).get("value", [])
        out[key] = np.array([np.nan if v is None else v for v in values], float)
    if stop is not None:
        keep = out["step"] < stop
        out = {k: v[: int(keep.sum())] for k, v in out.items()}
    return out


def _against_baseline(values: np.ndarray, compare: Callable[[Any, Any], Any]) -> np.ndarray:
    far, near = BASELINE
    base = np.full_like(values, np.nan)
    for i in range(far, len(values)):
        base[i] = np.median(values[i - far : i - near])
    return np.asarray(compare(values, base))


def signals(run: dict[str, np.ndarray]) -> dict[str, Signal]:
    steps = run["step"][WINDOW - 1 :]
    losses = sliding_window_view(run["loss"], WINDOW)
    levels = sliding_window_view(np.log10(np.maximum(run["gn"], 1e-30)), WINDOW)
    swing = losses.std(axis=1) / np.maximum(np.median(losses, axis=1), 1e-12)
    level = np.median(levels, axis=1)
    trend = np.full_like(level, np.nan)
    for i in range(100, len(level)):
        trend[i] = np.polyfit(np.arange(101), level[i - 100 : i + 1], 1)[0] * 100
    loss_level = np.median(losses, axis=1)
    out = {
        "loss swing (x its baseline)": (steps, _against_baseline(swing, np.divide)),
        "log10 grad-norm spread (+ baseline)": (
            steps,
            _against_baseline(levels.std(axis=1), np.subtract),
        ),
        "log10 grad-norm trend (decades/100 steps)": (steps, trend),
        "loss level (x its running minimum)": (
            steps,
            loss_level / np.maximum(np.minimum.accumulate(loss_level), 1e-12),
        ),
    }
    if len(run["lr"]) == len(run["step"]) and len(run["lr"]):
        update = sliding_window_view(np.log10(np.maximum(run["lr"] * run["gn"], 1e-30)), WINDOW)
        size = np.median(update, axis=1)
        out["lr (x the first)"] = (run["step"], run["lr"] / run["lr"][0])
        out["lr x grad norm (x its minimum)"] = (steps, 10 ** (size - np.minimum.accumulate(size)))
    return out


def raised_today(blowups: list[sc.Outcome]) -> None:
    """What the server raises now on each blow-up: its first alarm and that alarm's lead."""
    print("| run | first non-finite | first warning or critical | lead (steps) |")
    print("| --- | --- | --- | --- |")
    for blowup in blowups:
        assert blowup.lost_at is not None, f"{blowup.run['name']} never went non-finite"
        alarm = min(blowup.alarms(), key=lambda a: a["step"], default=None)
        lost = blowup.lost_at[0]
        first = f"{alarm['rule']} ({alarm['severity']}), step {alarm['step']}" if alarm else "none"
        lead = lost - alarm["step"] if alarm else "-"
        print(f"| {blowup.run['name']} | {lost} | {first} | {lead} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--today", action="store_true", help="only what the server raises now")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "early.db"))
        try:
            sc.run_scenario(server, "explode")
            blowups = [sc.outcome(server, "explode")]
            for seed, growth, act, depth in RAMPS:
                name = f"{act}{depth}-x{growth}-seed{seed}"
                ramp(server, name, seed, growth, act, depth)
                blowups.append(sc.outcome(server, "explode", name))
            if args.today:
                raised_today(blowups)
                return
            healthy: list[sc.Outcome] = []
            for shape in healthy_runs.HEALTHY:
                healthy += healthy_runs.run_healthy(server, shape, Path(tmp))
            sc.run_scenario(server, "healthy", "--epochs", "20")
            healthy.append(sc.outcome(server, "healthy"))
            calm = {o.run["name"]: signals(streams(server, o)) for o in healthy}
            thresholds: dict[str, tuple[float, str]] = {}
            for name, found in calm.items():
                for signal, (steps, values) in found.items():
                    ok = (steps >= 100) & np.isfinite(values)
                    top = float(values[ok].max()) if ok.any() else -np.inf
                    if top > thresholds.get(signal, (-np.inf, ""))[0]:
                        thresholds[signal] = (top, name)
            print("| signal | healthy maximum (threshold) | set by |\n| --- | --- | --- |")
            for signal, (top, name) in thresholds.items():
                print(f"| {signal} | {top:.3g} | {name} |")
            print("\nLead in steps before the first non-finite value, at those thresholds:\n")
            print("| run | first non-finite | " + " | ".join(thresholds) + " | today |")
            print("|" + " --- |" * (len(thresholds) + 3))
            for blowup in blowups:
                assert blowup.lost_at is not None, f"{blowup.run['name']} never went non-finite"
                lost = blowup.lost_at[0]
                found = signals(streams(server, blowup))
                cells = []
                for signal, (top, _) in thresholds.items():
                    steps, values = found.get(signal, (np.array([]), np.array([])))
                    late = (steps >= 200) & np.isfinite(values)
                    over = np.flatnonzero(late & (values > top))
                    under = np.flatnonzero(late & (values <= top))
                    since = under[-1] + 1 if len(under) else 0  # above from here to the end
                    first = str(lost - int(steps[over[0]])) if len(over) else "-"
                    held = str(lost - int(steps[since])) if since < len(steps) else "-"
                    cells.append(f"{first} / {held}")
                alarm = min(blowup.alarms(), key=lambda a: a["step"], default=None)
                now = f"{alarm['rule']}, {lost - alarm['step']}" if alarm else "none"
                print(f"| {blowup.run['name']} | {lost} | " + " | ".join(cells) + f" | {now} |")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
