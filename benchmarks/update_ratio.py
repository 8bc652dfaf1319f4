"""Would the per-layer update-to-weight ratio warn of a blow-up sooner than trainvitals does?

The literature's lead: ``|w_after - w_before| / |w_before|`` per layer is about 1e-3 in
healthy training and grows towards 1e-1 before a learning-rate blow-up. This measures it on
zoo runs (benchmarks/zoo.py) drawn from the classes where a precursor could help
(learning-rate blow-ups, label noise) and healthy ones, each trained in this process with a
probe that reads every kernel before and after each step, and streamed to a real server as
the zoo streams it; the server's alarms and the run's point of no return are judged as the
zoo judges them.

The threshold is set from the healthy runs themselves (above the highest sustained ratio any
of them showed, so the ratio raises no false alarm on this population by construction); each
failure run's lead by the ratio is compared with the lead of trainvitals' own first right
alarm. The probe copies the weights in Python at every step, so its cost says nothing of an
in-step implementation; the lead is what is measured.

    python benchmarks/update_ratio.py --runs 40 --seed 21 [--json ratio.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import zoo
from harness.processes import ServerProcess

CLASSES = ("lr_sudden", "lr_growing", "label_noise", "healthy")
#: Steps ignored at the start (the first updates of a fresh model are large by nature).
WARMUP = 50
#: A ratio counts once it has held for this many steps in a row.
SUSTAIN = 5


def probe() -> Any:
    """A Keras callback keeping, for every step, the largest and the median per-kernel ratio
    of the update to the weights."""
    import keras

    class RatioProbe(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.before: list[np.ndarray] = []
            self.ratios: list[tuple[float, float]] = []

        def _kernels(self) -> list[Any]:
            return [v for v in self.model.trainable_variables if len(v.shape) >= 2]

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.before = [np.array(v.numpy(), np.float64) for v in self._kernels()]

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            ratios = []
            for old, v in zip(self.before, self._kernels(), strict=True):
                new = np.array(v.numpy(), np.float64)
                size = float(np.linalg.norm(old))
                ratios.append(float(np.linalg.norm(new - old)) / size if size > 0 else 0.0)
            finite = [r for r in ratios if np.isfinite(r)] or [float("inf")]
            self.ratios.append((max(finite), float(np.median(finite))))

    return RatioProbe()


def first_sustained(values: list[float], bar: float, start: int = WARMUP) -> int | None:
    """The step (1-based) at which ``values`` had been above ``bar`` for SUSTAIN steps."""
    run = 0
    for i, value in enumerate(values[start:], start=start + 1):
        run = run + 1 if not value <= bar else 0  # NaN counts as above
        if run >= SUSTAIN:
            return i
    return None


def sustained_peak(values: list[float]) -> float:
    """The highest level a run held for SUSTAIN steps after the warm-up."""
    tail = np.asarray(values[WARMUP:], float)
    if len(tail) < SUSTAIN:
        return 0.0
    windows = np.lib.stride_tricks.sliding_window_view(np.nan_to_num(tail, nan=np.inf), SUSTAIN)
    return float(np.max(np.min(windows, axis=1)))


def measure(runs: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    specs = [zoo.draw(rng, i, CLASSES) for i in range(runs)]
    cheap = [s for s in specs if s["arch"] in ("mlp", "cnn", "rnn", "embedding", "transformer")]
    results: list[dict[str, Any]] = []
    import keras

    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(os.path.join(tmp, "ratio.db"))
        try:
            for spec in cheap:
                name = f"ratio{seed}-{spec['index']:03d}-{spec['kind']}"
                watch = probe()
                started = time.monotonic()
                zoo.train(spec, server.url, name, extra=(watch,))
                keras.mixed_precision.set_global_policy("float32")
                judged = zoo.Judged(name, spec, time.monotonic() - started, 0)
                zoo.judge(server, judged)
                results.append({"judged": judged, "ratios": watch.ratios})
        finally:
            server.stop()
    return summarize(results, seed)


def summarize(results: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    healthy = [r for r in results if r["judged"].spec["kind"] == "healthy"]
    failures = [
        r for r in results if r["judged"].spec["kind"] != "healthy" and not r["judged"].no_effect
    ]
    report: dict[str, Any] = {"seed": seed, "healthy_runs": len(healthy), "by": {}}
    for which, index in (("largest_layer", 0), ("median_layer", 1)):
        peaks = [sustained_peak([r[index] for r in run["ratios"]]) for run in healthy]
        bar = 1.25 * max(peaks) if peaks else 0.1
        rows = []
        for run in failures:
            judged = run["judged"]
            values = [r[index] for r in run["ratios"]]
            at = first_sustained(values, bar)
            lost = judged.lost_at
            rows.append({
                "run": judged.name,
                "kind": judged.spec["kind"],
                "lost_at": lost,
                "ratio_lead": None if at is None or lost is None else lost - at,
                "trainvitals_lead": judged.lead,
            })  # fmt: skip

        def share(rows: list[dict[str, Any]], key: str) -> float | None:
            return (
                sum(1 for r in rows if r[key] is not None and r[key] > 0) / len(rows)
                if rows
                else None
            )

        def middle(rows: list[dict[str, Any]], key: str) -> float | None:
            leads = [r[key] for r in rows if r[key] is not None]
            return statistics.median(leads) if leads else None

        report["by"][which] = {
            "healthy_sustained_peaks": sorted(peaks),
            "bar": bar,
            "per_class": {
                kind: {
                    "runs": len(group),
                    "ratio_warned_before": share(group, "ratio_lead"),
                    "trainvitals_warned_before": share(group, "trainvitals_lead"),
                    "ratio_median_lead": middle(group, "ratio_lead"),
                    "trainvitals_median_lead": middle(group, "trainvitals_lead"),
                    "ratio_earlier": sum(
                        1
                        for r in group
                        if r["ratio_lead"] is not None
                        and (
                            r["trainvitals_lead"] is None or r["ratio_lead"] > r["trainvitals_lead"]
                        )
                    ),
                }
                for kind in sorted({r["kind"] for r in rows})
                for group in [[r for r in rows if r["kind"] == kind]]
            },
            "runs": rows,
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = measure(args.runs, args.seed)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    for which, figures in report["by"].items():
        print(f"{which}: bar {figures['bar']:.3g} (healthy sustained peaks up to "
              f"{max(figures['healthy_sustained_peaks'], default=0):.3g})")  # fmt: skip
        for kind, row in figures["per_class"].items():
            print(f"  {kind}: {row}")


if __name__ == "__main__":
    main()
