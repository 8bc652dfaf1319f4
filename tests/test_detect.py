"""The detection core on synthetic streams: each rule fires on its failure, stays quiet on
healthy shapes, and the lifecycle turns findings into one alert per subject."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from trainvitals.detect import (
    Alert,
    AlertBook,
    Detector,
    Finding,
    RulesConfig,
    RulesError,
    RuleSet,
    Severity,
    load_rules,
)
from trainvitals.detect.engine import _thinned
from trainvitals.detect.process import stall_hint
from trainvitals.detect.settings import Lifecycle
from trainvitals.detect.stats import RollingWindow, theil_sen
from trainvitals.protocol import Columns, ListColumns

T0 = 1_800_000_000.0
Stream = dict[str, ListColumns]
GiB = 2**30


def stream(steps: range, dt: float, **series: Callable[[int], float]) -> Stream:
    """Columns as an agent frame carries them: every series recorded at every step."""
    return {
        name: Columns(list(steps), [T0 + s * dt for s in steps], [fn(s) for s in steps])
        for name, fn in series.items()
    }


def frames(columns: Stream, steps_per_frame: int) -> list[Stream]:
    """Cut a stream into the frames an agent would send (every series up to a step)."""
    last = max(max(steps) for steps, _, _ in columns.values())
    out = []
    for start in range(0, last + 1, steps_per_frame):
        frame: Stream = {}
        for name, (steps, times, values) in columns.items():
            keep = [i for i, s in enumerate(steps) if start <= s < start + steps_per_frame]
            if keep:
                frame[name] = Columns(
                    [steps[i] for i in keep],
                    [times[i] for i in keep],
                    [values[i] for i in keep],
                )
        out.append(frame)
    return out


def feed(detector: Detector, columns: Stream, steps_per_frame: int | None) -> list[Finding]:
    """Whole (the step-by-step path) or in frames (mostly the bulk path)."""
    if steps_per_frame is None:
        return detector.feed(columns)
    return [f for frame in frames(columns, steps_per_frame) for f in detector.feed(frame)]


#: Each stream is judged whole, in frames of 40 steps (a fast agent: mostly bulk), and of 3.
FRAMINGS = pytest.mark.parametrize("framing", [None, 40, 3])


def fired(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule and f.firing]


def run_through(detector: Detector, columns: Stream, framing: int | None = None):  # type: ignore[no-untyped-def]
    book = AlertBook()
    changes = []
    for finding in feed(detector, columns, framing):
        change = book.apply(finding)
        if change is not None:
            changes.append((change[0], change[1].rule, change[1].severity, finding.step))
    return book, changes


# -- statistics ----------------------------------------------------------------------------


def test_theil_sen_ignores_outliers_and_reports_agreement() -> None:
    times = [float(t) for t in range(100)]
    values = [1000 + 5 * t for t in times]
    values[10] = 1e9  # a reading taken mid-allocation
    values[50] = 0
    trend = theil_sen(times, values)
    assert trend.slope == pytest.approx(5, rel=1e-6)
    assert trend.at(99) == pytest.approx(1000 + 5 * 99, rel=1e-6)
    assert trend.agreement > 0.9
    noise = random.Random(1)
    flat = theil_sen(times, [1000 + noise.gauss(0, 10) for _ in times])
    assert flat.agreement < 0.7


def test_rolling_window_median_and_mad() -> None:
    window = RollingWindow(5, refresh=1)
    for value in (1, 2, 3, 100, 4):
        window.add(value)
    assert (window.median, window.mad) == (3, 1)
    for value in (10, 10, 10, 10, 10):
        window.add(value)
    assert (window.median, window.mad) == (10, 0)


# -- nonfinite ------------------------------------------------------------------------------


@FRAMINGS
def test_nonfinite_fires_in_the_same_step_and_names_the_input_batch(framing: int | None) -> None:
    columns = stream(
        range(1, 301),
        0.01,
        loss=lambda s: math.nan if s >= 120 else 1.0 / s,
        **{
            "grad/global_norm": lambda s: math.nan if s >= 120 else 1.0,
            "nonfinite/inputs": lambda s: 3.0 if s == 120 else 0.0,
            "nonfinite/loss": lambda s: 1.0 if s >= 120 else 0.0,
            "nonfinite/grads": lambda s: 50.0 if s >= 120 else 0.0,
        },
    )
    book, changes = run_through(Detector(), columns, framing)
    assert changes == [("fired", "nonfinite", "critical", 120)]
    alert = book.alerts[("nonfinite", "")]
    assert alert.step == 120
    assert alert.evidence["origin"] == "inputs"
    assert alert.evidence["where"] == ["inputs", "loss", "grads"]
    assert alert.evidence["counts"]["inputs"] == 3.0
    assert alert.evidence["last_finite_loss"] == pytest.approx(1 / 119)
    assert "input batch" in alert.message and "3 values" in alert.message
    assert "data" in alert.hint


@FRAMINGS
def test_nonfinite_from_the_loss_on_clean_data_resolves_after_clean_steps(
    framing: int | None,
) -> None:
    columns = stream(
        range(1, 400),
        0.01,
        loss=lambda s: math.inf if s == 50 else 1.0,
        **{"nonfinite/inputs": lambda s: 0.0},
    )
    _, changes = run_through(Detector(), columns, framing)
    assert changes == [
        ("fired", "nonfinite", "critical", 50),
        ("resolved", "nonfinite", "critical", 150),
    ]


def test_loss_scaling_skips_under_mixed_precision_are_not_alerts() -> None:
    detector = Detector(env={"mixed_precision_policy": "mixed_float16"})
    columns = stream(
        range(1, 200),
        0.01,
        loss=lambda s: 1.0,
        **{"nonfinite/grads": lambda s: 10.0 if s % 40 == 0 else 0.0},
    )
    assert fired(detector.feed(columns), "nonfinite") == []
    collapse = stream(
        range(200, 230), 0.01, loss=lambda s: 1.0, **{"nonfinite/grads": lambda s: 9.0}
    )
    assert [f.step for f in fired(detector.feed(collapse), "nonfinite")] == [209]


# -- gradients -----------------------------------------------------------------------------


def healthy_norm(seed: int) -> Callable[[int], float]:
    """A noisy small-batch gradient norm: log-normal around a slowly falling level, with
    a large warm-up start."""
    noise = random.Random(seed)
    return lambda s: (
        (5.0 if s < 20 else 1.0) * (1 + 1 / math.sqrt(s)) * math.exp(noise.gauss(0, 0.5))
    )


@FRAMINGS
def test_exploding_gradients_warn_orders_of_magnitude_before_the_nan(framing: int | None) -> None:
    def norm(s: int) -> float:
        return 1.0 if s < 200 else (math.nan if s >= 260 else 1.0 * 1.2 ** (s - 200))

    columns = stream(range(1, 300), 0.01, **{"grad/global_norm": norm, "loss": lambda s: 1.0})
    columns.update(
        stream(
            range(10, 300, 10),
            0.01,
            **{
                "grad/norm/dense/kernel": lambda s: 0.5,
                "grad/norm/dense_1/kernel": lambda s: 0.5 if s < 200 else 0.5 * 1.3 ** (s - 200),
            },
        )
    )
    book, changes = run_through(Detector(), columns, framing)
    explosion = [c for c in changes if c[1] == "grad_explosion"]
    assert explosion[0][0] == "fired" and explosion[0][3] < 220  # 40 steps before the NaN
    assert ("updated", "grad_explosion", "critical") == explosion[1][:3]
    alert = book.alerts[("grad_explosion", "")]
    assert alert.evidence["layers"][0]["variable"] == "dense_1/kernel"


@pytest.mark.parametrize("seed", range(5))
@FRAMINGS
def test_noisy_healthy_gradients_raise_nothing(seed: int, framing: int | None) -> None:
    columns = stream(range(1, 3000), 0.01, **{"grad/global_norm": healthy_norm(seed)})
    assert fired(feed(Detector(), columns, framing), "grad_explosion") == []


def deep_sigmoid_layers() -> dict[str, Callable[[int], float]]:
    """Per-layer gradient norms ten times smaller at each layer back from the output."""

    def layer(depth: int) -> Callable[[int], float]:
        return lambda s: 10.0 ** (-8 + depth)

    return {f"grad/norm/dense_{i}/kernel": layer(i) for i in range(6)}


@FRAMINGS
def test_vanishing_gradients_in_early_layers_with_a_flat_loss(framing: int | None) -> None:
    layers = deep_sigmoid_layers()
    columns = stream(range(1, 400), 0.01, loss=lambda s: 2.3026 + 0.001 * math.sin(s))
    columns.update(stream(range(10, 400, 10), 0.01, **layers))
    book, changes = run_through(Detector(), columns, framing)
    assert [c[:2] for c in changes] == [("fired", "grad_vanishing")]
    alert = book.alerts[("grad_vanishing", "")]
    assert alert.evidence["early_variable"] == "dense_0/kernel"
    assert alert.evidence["top_variable"] == "dense_5/kernel"


@FRAMINGS
def test_small_early_gradients_while_the_loss_falls_are_not_vanishing(framing: int | None) -> None:
    layers = deep_sigmoid_layers()
    columns = stream(range(1, 400), 0.01, loss=lambda s: 2.3 / s**0.5)
    columns.update(stream(range(10, 400, 10), 0.01, **layers))
    assert fired(feed(Detector(), columns, framing), "grad_vanishing") == []


# -- loss ----------------------------------------------------------------------------------


@FRAMINGS
def test_a_loss_that_climbs_back_warns_then_turns_critical(framing: int | None) -> None:
    noise = random.Random(3)

    def loss(s: int) -> float:
        level = 2.0 / (1 + s / 50) if s < 400 else 2.0 / 9 * 1.01 ** (s - 400)
        return level * math.exp(noise.gauss(0, 0.2))

    book, changes = run_through(Detector(), stream(range(1, 700), 0.01, loss=loss), framing)
    divergence = [c for c in changes if c[1] == "loss_divergence"]
    assert divergence[0][:3] == ("fired", "loss_divergence", "warning")
    assert 400 < divergence[0][3] < 520
    assert ("updated", "loss_divergence", "critical") == divergence[1][:3]
    assert book.alerts[("loss_divergence", "")].evidence["start"] == pytest.approx(0.77, rel=0.2)


@pytest.mark.parametrize("seed", range(5))
@FRAMINGS
def test_a_noisy_falling_loss_with_warmup_and_restarts_raises_nothing(
    seed: int, framing: int | None
) -> None:
    noise = random.Random(seed)

    def loss(s: int) -> float:
        warmup = 3.0 if s < 30 else 1.0  # the learning-rate ramp shakes the start
        restart = 1.3 if s % 500 < 50 and s > 500 else 1.0  # cosine warm restarts
        return warmup * restart * 2.0 / (1 + s / 100) * math.exp(noise.gauss(0, 0.4))

    findings = feed(Detector(), stream(range(1, 2000), 0.01, loss=loss), framing)
    assert [f for f in findings if f.severity != "info"] == []


@pytest.mark.parametrize("seed", range(5))
def test_a_resumed_run_on_a_noisy_plateau_raises_nothing(seed: int) -> None:
    """Little left to learn and batches whose loss varies by a factor of two: lucky stretches
    of easy batches must not set a minimum that the ordinary level then "diverges" from."""
    noise = random.Random(seed)

    def loss(s: int) -> float:
        return (0.12 + 0.04 * math.exp(-s / 150)) * math.exp(noise.gauss(0, 0.8))

    findings = feed(Detector(), stream(range(1, 6000), 0.01, loss=loss), 40)
    assert [f.message for f in findings if f.firing and f.severity != "info"] == []


# -- memory --------------------------------------------------------------------------------


def test_system_samples_beyond_25_a_second_are_judged_at_25_a_second() -> None:
    dense = Columns(
        list(range(200)), [T0 + i * 0.01 for i in range(200)], [float(i) for i in range(200)]
    )
    steps, times, values = _thinned(dense)
    assert len(steps) in (50, 51)  # a bucket of 0.04 s each, the last sample of each
    assert values[-1] == 199.0 and min(np.diff(times)) > 0.02
    per_second = Columns([1, 2, 3], [T0, T0 + 1, T0 + 2], [1.0, 2.0, 3.0])
    assert _thinned(per_second) == per_second


def host(rss: Callable[[int], float], limit: float = 4 * GiB) -> Stream:
    seconds = range(0, 300)
    return {
        "host/rss": Columns(
            [7] * len(seconds), [T0 + t for t in seconds], [rss(t) for t in seconds]
        ),
        "host/limit": Columns(
            [7] * len(seconds), [T0 + t for t in seconds], [limit] * len(seconds)
        ),
    }


def test_a_steady_leak_forecasts_the_oom_with_its_eta() -> None:
    noise = random.Random(0)
    leak = 4 * 2**20  # 4 MiB/s from 1 GiB: the 4 GiB limit is 768 s away at t=0
    book, changes = run_through(Detector(), host(lambda t: GiB + leak * t + noise.gauss(0, 2**20)))
    assert changes[0][:3] == ("fired", "oom_forecast", "warning")
    alert = book.alerts[("oom_forecast", "host")]
    eta = alert.evidence["eta_s"]
    expected = (4 * GiB - (GiB + leak * (alert.updated_time - T0))) / leak
    assert eta == pytest.approx(expected, rel=0.1)
    assert alert.evidence["forecast"]["value"][1] == 4 * GiB
    assert alert.evidence["slope"] == pytest.approx(leak, rel=0.05)
    assert "MiB/min" in alert.message


def test_a_leak_far_from_its_limit_and_noisy_flat_memory_raise_nothing() -> None:
    noise = random.Random(0)
    slow = Detector().feed(host(lambda t: GiB + 1000 * t, limit=64 * GiB))
    flat = Detector().feed(host(lambda t: 3 * GiB + noise.gauss(0, 50 * 2**20)))
    warmup = Detector().feed(host(lambda t: GiB * min(1.0, 0.3 + t / 10)))
    assert fired(slow + flat + warmup, "oom_forecast") == []


def test_memory_pressure_escalates_with_the_fraction_used() -> None:
    _, changes = run_through(Detector(), host(lambda t: (0.5 + t / 300 * 0.5) * 4 * GiB))
    pressure = [c[:3] for c in changes if c[1] == "memory_pressure"]
    assert pressure == [
        ("fired", "memory_pressure", "warning"),
        ("updated", "memory_pressure", "critical"),
    ]


# -- process and hardware -------------------------------------------------------------------


@FRAMINGS
def test_slowdown_after_a_steady_baseline(framing: int | None) -> None:
    columns = stream(range(1, 800), 0.01, step_time=lambda s: 0.01 if s < 500 else 0.08)
    _, changes = run_through(Detector(), columns, framing)
    assert [(c[0], c[1]) for c in changes] == [("fired", "slowdown")]
    assert 550 <= changes[0][3] <= 600


def test_stall_hint_reads_the_stacks() -> None:
    assert "input pipeline" in stall_hint(
        'File "train.py", line 9, in batches\n  for x in generator'
    )
    assert "collective" in stall_hint("in _all_reduce\n  nccl")
    detector = Detector()
    detector.feed(stream(range(1, 10), 0.1, loss=lambda s: 1.0))
    (finding,) = detector.stalled(9, T0 + 100, idle=60, threshold=30, stacks="in __next__")
    assert finding.firing and finding.evidence["stacks"] == "in __next__"
    step = stream(range(10, 11), 0.1, loss=lambda s: 1.0)
    resumed = [f for f in detector.feed(step) if f.rule == "stall"]
    assert [(f.firing, f.step) for f in resumed] == [(False, 10)]  # steps again: resolved
    later = stream(range(11, 12), 0.1, loss=lambda s: 1.0)
    assert [f for f in detector.feed(later) if f.rule == "stall"] == []


def test_thermal_throttling_and_hardware_errors_on_a_gpu() -> None:
    seconds = range(30)

    def gpu(
        **values: Callable[[int], float],
    ) -> Stream:
        return {
            f"gpu0/{k}": Columns([5] * 30, [T0 + t for t in seconds], [fn(t) for t in seconds])
            for k, fn in values.items()
        }

    book, changes = run_through(
        Detector(),
        gpu(
            temp=lambda t: 70 + t,
            throttle=lambda t: 0x20 if t >= 10 else 0x4,
            ecc_uncorrected=lambda t: 2 if t >= 20 else 0,
            xid_errors=lambda t: 0,
        ),
    )
    assert ("fired", "thermal", "warning", 5) in changes
    assert ("fired", "hardware", "critical", 5) in changes
    assert book.alerts[("thermal", "gpu0")].severity == "critical"  # 92 degrees at t=22
    assert book.alerts[("hardware", "gpu0")].evidence["count"] == 2


@pytest.mark.parametrize(
    ("tf_cuda", "driver", "severity"),
    [("12.5.1", "12040", "warning"), ("12.3", "11080", "critical"), ("12.3", "12040", None)],
)
def test_cuda_the_build_expects_against_the_driver(
    tf_cuda: str, driver: str, severity: str | None
) -> None:
    env = {
        "tensorflow": "2.21.0",
        "tf_build": {"cuda_version": tf_cuda, "is_cuda_build": True},
        "tf_gpus": ["/physical_device:GPU:0"],
        "nvml": {"cuda_driver_version": driver, "gpus": [{"name": "H100"}]},
    }
    findings = Detector(env=env).hello(0, T0)
    assert [f.severity for f in findings] == ([severity] if severity else [])


def test_gpus_tensorflow_cannot_see() -> None:
    env = {
        "tf_build": {"cuda_version": "12.5", "is_cuda_build": True},
        "tf_gpus": [],
        "nvml": {"cuda_driver_version": "12080", "gpus": [{"name": "A100"}]},
    }
    (finding,) = Detector(env=env).hello(0, T0)
    assert finding.severity == "critical" and "TensorFlow sees none" in finding.message


def test_a_crash_carries_the_last_memory_readings() -> None:
    detector = Detector()
    detector.feed(host(lambda t: 3.9 * GiB))
    (finding,) = detector.ended("oom_killed", T0 + 400)
    assert finding.severity == "critical"
    assert finding.evidence["last_readings"]["host/rss"] == 3.9 * GiB
    assert "OOM killer" in finding.message and "OOM killer" in finding.hint
    assert detector.ended("completed", T0 + 400) == []


# -- lifecycle ----------------------------------------------------------------------------


def finding(firing: bool, time: float, severity: Severity = "warning", eta: float = 0) -> Finding:
    return Finding(
        "oom_forecast", "host", firing, int(time), time, severity, "m", "h", {"eta_s": eta}
    )


def test_one_alert_per_subject_updates_at_most_every_interval() -> None:
    ids = iter(["a", "b"])
    book = AlertBook(Lifecycle(cooldown=300, update_interval=5), new_id=lambda: next(ids))
    assert book.apply(finding(True, 0, eta=600))[0] == "fired"  # type: ignore[index]
    assert book.apply(finding(True, 2, eta=590)) is None  # too soon to move the ETA
    change = book.apply(finding(True, 5, eta=580))
    assert change is not None and change[0] == "updated" and change[1].evidence["eta_s"] == 580
    change = book.apply(finding(True, 6, severity="critical"))  # escalation: at once
    assert change is not None and change[1].severity == "critical"
    assert book.apply(finding(False, 10))[0] == "resolved"  # type: ignore[index]
    reopened = book.apply(finding(True, 100))
    assert reopened is not None and reopened[0] == "fired"
    assert (reopened[1].id, reopened[1].count, reopened[1].resolved_time) == ("a", 2, None)
    book.apply(finding(False, 110))
    fresh = book.apply(finding(True, 500))  # past the cooldown: a new alert
    assert fresh is not None and (fresh[1].id, fresh[1].count) == ("b", 1)


def test_resolve_all_keeps_the_crash() -> None:
    book = AlertBook()
    book.apply(finding(True, 0))
    book.apply(Finding("crash", "", True, 9, 1.0, "critical", "m", "h"))
    resolved = book.resolve_all(2.0, keep=("crash",))
    assert [a.rule for a in resolved] == ["oom_forecast"]
    assert book.alerts[("crash", "")].state == "firing"
    restored = AlertBook()
    restored.load([Alert.from_dict(a.as_dict()) for a in book.alerts.values()])
    assert restored.apply(Finding("crash", "", True, 9, 3.0, "critical", "m", "h")) is None


# -- settings ------------------------------------------------------------------------------


def test_rules_file_defaults_and_project_overrides(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        "[alerts]\ncooldown = 60\n[grad_explosion]\nfactor = 20\n"
        "[projects.gan.loss_divergence]\nenabled = false\n"
    )
    rules = load_rules(path)
    assert rules.defaults.grad_explosion.factor == 20.0
    assert rules.defaults.alerts.cooldown == 60.0
    gan = rules.for_project("gan")
    assert gan.loss_divergence.enabled is False and gan.grad_explosion.factor == 20.0
    assert rules.for_project("other").loss_divergence.enabled is True
    assert all(r.id != "loss_divergence" for r in Detector(gan).rules)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[grad_explosoin]\nfactor = 2\n", "unknown rule"),
        ("[grad_explosion]\nfactr = 2\n", "'factr': unknown setting"),
        ("[grad_explosion]\nfactor = 'big'\n", "expected a number"),
        ("[nonfinite]\nenabled = 1\n", "expected true or false"),
        ("[oom_forecast]\nhorizon = -5\n", ">= 0"),
        ("[grad_explosion\n", "not valid TOML"),
    ],
)
def test_bad_rules_files_name_the_setting(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=complaint):
        load_rules(path)


def test_default_rules_cover_every_contract_rule() -> None:
    from trainvitals.detect import RULES

    assert set(RULES) <= set(RuleSet().as_dict())
    assert RulesConfig.from_mapping({}).defaults == RuleSet()
