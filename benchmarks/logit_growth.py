"""Would attention-logit growth or output-logit divergence warn of a blow-up sooner than
trainvitals does?

Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer training
instabilities") see two precursors of a Transformer's loss divergence: the largest attention
logit ``q.k / sqrt(d)`` grows without bound, and the output logits drift away from
log-probabilities (the softmax's normaliser ``log Z`` leaves 0; their z-loss penalises
``log^2 Z``). This measures both on the zoo's Transformer-shaped runs (benchmarks/zoo.py:
``transformer``, one ``MultiHeadAttention`` block, and ``hub_bert``, a one-layer
``keras_hub`` BERT), healthy and with learning-rate blow-ups and label noise, each trained in
this process with a probe and streamed to a real server as the zoo streams it; the server's
alarms and the run's point of no return are judged as the zoo judges them.

The probe, every ``--every`` steps, runs the model on a fixed batch of the run's own data (its
first 64 examples, in inference mode) and keeps:

- per attention layer, the largest ``|q.k| / sqrt(d)``. Keras's ``MultiHeadAttention`` feeds
  its inputs through its ``_query_dense`` and ``_key_dense`` sublayers, whatever model holds
  it (a ``keras_hub`` encoder calls it inside its own ``call``, where no functional graph
  reaches its inputs), so the probe wraps those two sublayers' ``call`` while it traces the
  look and takes their outputs, then forms the logits with the layer's own einsum equation and
  scale. On the zoo's ``transformer``, this equals the logits recomputed from a sub-model of
  the layer's inputs. The zoo's BERT masks no token, so no position is left out;
- of the output logits (the zoo's models end in logits, the loss ``from_logits``): the largest
  ``|logit|``, and ``sqrt(mean(log^2 Z))`` (``log Z`` each example's ``logsumexp``; the root
  of Wortsman's z-loss, in logit units).

A probe is a ``tf.function`` traced once; its seconds (the trace aside) are set against the
median step's. It is a look between steps, so its cost bounds from above what the same
figures would cost inside the compiled step, where the attention logits are computed already
and only the reductions would be added.

Each signal is judged under three rules, each firing once the rule's figure has been above
its bar for ``SUSTAIN`` probes in a row: ``early``, growth over the run's early value (the
median of its probes in steps ``WARMUP`` to ``WARMUP + EARLY``; the failures are injected
later, after 30% of the run); ``recent``, growth over its level ``RECENT`` to ``2 * RECENT``
steps before (the pace of a blow-up, not of learning); ``level``, the value itself. The bar is
1.25 times the highest figure any healthy run held after the early window. False alarms are
the healthy runs over a bar drawn from the others (a bar drawn from all of them raises none
by construction), and the failure runs over it before their injection. Each failure run's
lead (its point of no return less the first step after the injection at which the rule
fired) is set against the lead of trainvitals' own first right alarm (``Judged.lead``).

    python benchmarks/logit_growth.py --seed 23 [--json logits.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import zoo
from harness.processes import ServerProcess

ARCHS = ("transformer", "hub_bert")
#: Runs of each class drawn by default (label noise never draws ``hub_bert``: token inputs).
MIX = {"healthy": 10, "lr_sudden": 6, "lr_growing": 6, "label_noise": 2}
SIGNALS = ("attention_logit", "output_logit", "log_z")
#: Examples in the probe's fixed batch.
PROBE = 64
#: Steps before a signal's early value is taken (a fresh model's logits move fast), and the
#: steps over which it is taken.
WARMUP = 30
EARLY = 40
#: The ``recent`` rule's reference: the signal's level this many to twice as many steps before.
RECENT = 25
#: A rule fires once its signal has been above the bar this many probes in a row.
SUSTAIN = 2
#: The bar: this many times the highest growth a healthy run held.
MARGIN = 1.25


@contextmanager
def _recording(layers: list[Any]) -> Iterator[dict[tuple[int, str], Any]]:
    """While inside, each attention layer's query and key projections keep their outputs
    (by layer and ``"q"``/``"k"``); their ``call`` is the class's again on leaving."""
    seen: dict[tuple[int, str], Any] = {}

    def wrap(sublayer: Any, key: tuple[int, str]) -> None:
        plain = sublayer.call

        def call(*args: Any, **kwargs: Any) -> Any:
            seen[key] = plain(*args, **kwargs)
            return seen[key]

        sublayer.call = call

    try:
        for i, layer in enumerate(layers):
            wrap(layer._query_dense, (i, "q"))
            wrap(layer._key_dense, (i, "k"))
        yield seen
    finally:
        for layer in layers:
            for sublayer in (layer._query_dense, layer._key_dense):
                vars(sublayer).pop("call", None)


def probe(inputs: np.ndarray, every: int) -> Any:
    """A Keras callback that, every ``every`` steps, keeps the largest attention logit of each
    attention layer, the largest output logit and the root of the mean ``log^2 Z`` on
    ``inputs``; and each step's and each look's seconds."""
    import keras
    import tensorflow as tf
    from keras import ops

    class LogitProbe(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.began = 0.0
            #: (step, [largest |attention logit| per layer], largest |output logit|, log Z)
            self.looks: list[tuple[int, list[float], float, float]] = []
            self.step_seconds: list[float] = []
            self.look_seconds: list[float] = []
            self.layers: list[Any] = []
            self.look: Any = None

        def on_train_begin(self, logs: Any = None) -> None:
            self.layers = [
                layer
                for layer in self.model._flatten_layers()
                if isinstance(layer, keras.layers.MultiHeadAttention)
            ]
            model, layers, batch = self.model, self.layers, tf.constant(inputs)

            @tf.function(autograph=False)  # type: ignore[untyped-decorator]
            def look() -> tuple[Any, Any, Any]:
                with _recording(layers) as seen:  # acts while it traces
                    logits = ops.cast(model(batch, training=False), "float32")
                attention = [
                    ops.max(
                        ops.abs(
                            ops.einsum(
                                layer._dot_product_equation,
                                seen[i, "k"],
                                seen[i, "q"] * layer._inverse_sqrt_key_dim,
                            )
                        )
                    )
                    for i, layer in enumerate(layers)
                ]
                log_z = ops.logsumexp(logits, axis=-1)
                return (
                    ops.stack(attention) if attention else ops.zeros((0,)),
                    ops.max(ops.abs(logits)),
                    ops.sqrt(ops.mean(ops.square(log_z))),
                )

            self.look = look

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            ended = time.perf_counter()
            self.step += 1
            self.step_seconds.append(ended - self.began)
            if self.step % every:
                return
            attention, output, log_z = self.look()
            self.look_seconds.append(time.perf_counter() - ended)
            self.looks.append(
                (self.step, [_level(a) for a in np.asarray(attention)], _level(output),
                 _level(log_z))
            )  # fmt: skip

    return LogitProbe()


def _level(value: Any) -> float:
    """A probe's figure, NaN/Inf read as infinite (a poisoned model is above any bar)."""
    number = float(value)
    return number if np.isfinite(number) else float("inf")


def series(looks: list[tuple[int, list[float], float, float]], signal: str) -> list[float]:
    if signal == "attention_logit":
        return [max(attention, default=0.0) for _, attention, _, _ in looks]
    return [output if signal == "output_logit" else log_z for _, _, output, log_z in looks]


def early_growth(steps: list[int], values: list[float]) -> list[float]:
    """Each probe's value over the run's early value (the median in steps ``WARMUP`` to
    ``WARMUP + EARLY``)."""
    early = [v for s, v in zip(steps, values, strict=True) if WARMUP < s <= WARMUP + EARLY]
    base = statistics.median(early) if early else float("nan")
    return [v / base if np.isfinite(base) and base > 0 else float("nan") for v in values]


def recent_growth(steps: list[int], values: list[float]) -> list[float]:
    """Each probe's value over the median of those ``RECENT`` to ``2 * RECENT`` steps before
    it: growth at the pace of a blow-up, not of learning."""
    out = []
    for step, value in zip(steps, values, strict=True):
        before = [v for s, v in zip(steps, values, strict=True) if 0 < step - s - RECENT <= RECENT]
        base = statistics.median(before) if before else float("nan")
        out.append(value / base if np.isfinite(base) and base > 0 else float("nan"))
    return out


def level(steps: list[int], values: list[float]) -> list[float]:
    """The signal itself: Wortsman's logits are large in absolute terms before a divergence."""
    return values


RULES = {"early": early_growth, "recent": recent_growth, "level": level}


def first_sustained(steps: list[int], values: list[float], bar: float, after: int) -> int | None:
    """The step at which ``values`` past step ``after`` had been above ``bar`` for SUSTAIN
    probes in a row."""
    run = 0
    for step, value in zip(steps, values, strict=True):
        if step <= after:
            continue
        run = run + 1 if not value <= bar else 0  # NaN counts as above
        if run >= SUSTAIN:
            return step
    return None


def sustained_peak(steps: list[int], values: list[float]) -> float:
    """The highest level a run held for SUSTAIN probes after the early window."""
    tail = np.asarray([v for s, v in zip(steps, values, strict=True) if s > WARMUP + EARLY])
    if len(tail) < SUSTAIN:
        return 0.0
    windows = np.lib.stride_tricks.sliding_window_view(np.nan_to_num(tail, nan=np.inf), SUSTAIN)
    return float(np.max(np.min(windows, axis=1)))


def specs(seed: int, mix: dict[str, int]) -> list[dict[str, Any]]:
    """Zoo recipes of each class in ``mix``, as many as it says, drawn with ``seed`` until
    their architecture is one of ARCHS."""
    rng = np.random.default_rng(seed)
    drawn: list[dict[str, Any]] = []
    for kind, count in mix.items():
        while sum(1 for s in drawn if s["kind"] == kind) < count:
            spec = zoo.draw(rng, len(drawn), (kind,))
            if spec["arch"] in ARCHS:
                drawn.append(spec)
    return drawn


def measure(seed: int, mix: dict[str, int], every: int) -> dict[str, Any]:
    import keras

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(os.path.join(tmp, "logits.db"))
        try:
            for spec in specs(seed, mix):
                name = f"logits{seed}-{spec['index']:03d}-{spec['kind']}"
                x = zoo._dataset(spec, np.random.default_rng(spec["seed"]))[0]
                watch = probe(np.asarray(x[:PROBE]), every)
                started = time.monotonic()
                zoo.train(spec, server.url, name, extra=(watch,))
                keras.mixed_precision.set_global_policy("float32")
                judged = zoo.Judged(name, spec, time.monotonic() - started, 0)
                zoo.judge(server, judged)
                results.append({"judged": judged, "probe": watch})
                print(f"{name} ({spec['arch']}): {judged.steps} steps, lost at "
                      f"{judged.lost_at}, trainvitals' lead {judged.lead}", flush=True)  # fmt: skip
                keras.backend.clear_session()
        finally:
            server.stop()
    return summarize(results, seed, every)


def _share(rows: list[dict[str, Any]], key: str) -> str:
    return f"{sum(1 for r in rows if r[key] is not None and r[key] > 0)} of {len(rows)}"


def _middle(rows: list[dict[str, Any]], key: str) -> float | None:
    leads = [r[key] for r in rows if r[key] is not None]
    return statistics.median(leads) if leads else None


def judged_rule(
    healthy: list[dict[str, Any]], failures: list[dict[str, Any]], signal: str, rule: str
) -> dict[str, Any]:
    """One signal under one rule: its bar from the healthy runs, its false alarms (healthy
    runs over the others' bar, failure runs over it before the injection) and its leads."""

    def grown(run: dict[str, Any]) -> tuple[list[int], list[float]]:
        looks = run["probe"].looks
        steps = [s for s, _, _, _ in looks]
        return steps, RULES[rule](steps, series(looks, signal))

    peaks = {r["judged"].name: sustained_peak(*grown(r)) for r in healthy}
    bar = MARGIN * max(peaks.values()) if peaks else float("inf")
    false_alarms = [
        name
        for name, peak in peaks.items()
        if peak > MARGIN * max((p for n, p in peaks.items() if n != name), default=np.inf)
    ]
    rows = []
    for run in failures:
        judged = run["judged"]
        steps, values = grown(run)
        injected = judged.spec["at"]  # its first step with the failure is the next one
        early = first_sustained(steps, values, bar, WARMUP + EARLY)
        at = first_sustained(steps, values, bar, injected)
        lost = judged.lost_at
        rows.append({
            "run": judged.name,
            "arch": judged.spec["arch"],
            "kind": judged.spec["kind"],
            "injected_at": injected,
            "lost_at": lost,
            "fired_before_injection": early is not None and early <= injected,
            "fired_at": at,
            "signal_lead": None if at is None or lost is None else lost - at,
            "trainvitals_lead": judged.lead,
            "peak_growth": max((v for v in values if not np.isnan(v)), default=None),
        })  # fmt: skip
    archs = {r["judged"].name: r["judged"].spec["arch"] for r in healthy}
    return {
        "bar": bar,
        "healthy_sustained_growth": dict(sorted(peaks.items(), key=lambda kv: kv[1])),
        "healthy_peak_by_arch": {
            arch: max(p for n, p in peaks.items() if archs[n] == arch)
            for arch in sorted(set(archs.values()))
        },
        "false_alarms_left_out": false_alarms,
        "fired_before_injection": [r["run"] for r in rows if r["fired_before_injection"]],
        "per_class": {
            kind: {
                "runs": len(group),
                "signal_warned_before": _share(group, "signal_lead"),
                "trainvitals_warned_before": _share(group, "trainvitals_lead"),
                "signal_median_lead": _middle(group, "signal_lead"),
                "trainvitals_median_lead": _middle(group, "trainvitals_lead"),
                "median_steps_behind_trainvitals": _middle(
                    [
                        {"behind": r["trainvitals_lead"] - r["signal_lead"]}
                        for r in group
                        if r["signal_lead"] is not None and r["trainvitals_lead"] is not None
                    ],
                    "behind",
                ),
                "signal_earlier": sum(
                    1
                    for r in group
                    if r["signal_lead"] is not None
                    and (r["trainvitals_lead"] is None or r["signal_lead"] > r["trainvitals_lead"])
                ),
            }
            for kind in sorted({r["kind"] for r in rows})
            for group in [[r for r in rows if r["kind"] == kind]]
        },
        "runs": rows,
    }


def summarize(results: list[dict[str, Any]], seed: int, every: int) -> dict[str, Any]:
    healthy = [r for r in results if r["judged"].spec["kind"] == "healthy"]
    failures = [
        r for r in results if r["judged"].spec["kind"] != "healthy" and not r["judged"].no_effect
    ]
    looks = [s for r in results for s in r["probe"].look_seconds[1:]]  # the first traces
    steps = [s for r in results for s in r["probe"].step_seconds]
    ratios = [
        statistics.median(r["probe"].look_seconds[1:]) / statistics.median(r["probe"].step_seconds)
        for r in results
        if len(r["probe"].look_seconds) > 1
    ]
    return {
        "seed": seed,
        "every": every,
        "runs": len(results),
        "healthy_runs": len(healthy),
        "archs": {
            kind: sorted(
                r["judged"].spec["arch"] for r in results if r["judged"].spec["kind"] == kind
            )
            for kind in {r["judged"].spec["kind"] for r in results}
        },
        "without_effect": [r["judged"].name for r in results if r["judged"].no_effect],
        "trainvitals_false_alarms": [r["judged"].name for r in healthy if r["judged"].alarms],
        "cost": {
            "probe_seconds_median": statistics.median(looks) if looks else None,
            "trace_seconds_median": statistics.median(
                r["probe"].look_seconds[0] for r in results if r["probe"].look_seconds
            ),
            "step_seconds_median": statistics.median(steps) if steps else None,
            "probe_over_step_median": statistics.median(ratios) if ratios else None,
            "per_step_at_every": statistics.median(ratios) / every if ratios else None,
        },
        "by": {
            f"{signal}/{rule}": judged_rule(healthy, failures, signal, rule)
            for signal in SIGNALS
            for rule in RULES
        },
        "looks": {
            r["judged"].name: [[s, a, o, z] for s, a, o, z in r["probe"].looks] for r in results
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument(
        "--mix",
        default=",".join(f"{k}={v}" for k, v in MIX.items()),
        help="runs of each class, as class=count,...",
    )
    parser.add_argument("--every", type=int, default=5, help="steps between two probes")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    mix = {k: int(v) for k, v in (part.split("=") for part in args.mix.split(","))}
    report = measure(args.seed, mix, args.every)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    cost = report["cost"]
    print(f"{report['runs']} runs ({report['healthy_runs']} healthy, without effect: "
          f"{report['without_effect'] or 'none'}); trainvitals' false alarms: "
          f"{report['trainvitals_false_alarms'] or 'none'}")  # fmt: skip
    print(f"probe: {cost['probe_seconds_median'] * 1e3:.2f} ms a look, "
          f"{cost['probe_over_step_median']:.2f} steps' time; "
          f"{cost['per_step_at_every']:.1%} a step at one look every {report['every']} steps "
          f"(median step {cost['step_seconds_median'] * 1e3:.2f} ms); its trace "
          f"{cost['trace_seconds_median']:.2f} s once")  # fmt: skip
    for which, figures in report["by"].items():
        peaks = ", ".join(f"{a} {p:.3g}" for a, p in figures["healthy_peak_by_arch"].items())
        print(f"{which}: bar {figures['bar']:.3g} (healthy peaks: {peaks}); false alarms: "
              f"healthy runs over the others' bar {len(figures['false_alarms_left_out'])} of "
              f"{len(figures['healthy_sustained_growth'])}, failure runs before their "
              f"injection {len(figures['fired_before_injection'])}")  # fmt: skip
        for kind, row in figures["per_class"].items():
            print(f"  {kind} ({row['runs']}): warned before {row['signal_warned_before']}, "
                  f"median lead {row['signal_median_lead']} against trainvitals' "
                  f"{row['trainvitals_warned_before']}, {row['trainvitals_median_lead']}; "
                  f"earlier than trainvitals in {row['signal_earlier']}, median "
                  f"{row['median_steps_behind_trainvitals']} steps behind it")  # fmt: skip


if __name__ == "__main__":
    main()
