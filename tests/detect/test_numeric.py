"""Rules on training's numbers: NaN/Inf, exploding and vanishing gradients, the loss."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import framing
from tests.detect.streams import FRAMINGS, Stream, feed, fired, run_through, stream, unfrozen
from trainvitals.detect import (
    Detector,
    Finding,
)

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


@FRAMINGS
def test_steps_the_loss_scale_skips_are_not_alerts_however_many(framing: int | None) -> None:
    """With the loss scale recorded, a gradient overflow under a scale above 1 is a step the
    optimizer skips, however many come in a row (a scale that starts high halves on each);
    one under a scale of 1 or less is the gradients' own, critical at once."""

    def scale(s: int) -> float:
        return 2.0 ** max(30 - s, 15) if s < 300 else 0.5

    columns = stream(
        range(1, 320),
        0.01,
        loss=lambda s: 1.0,
        loss_scale=scale,
        **{
            "nonfinite/grads": lambda s: 5.0 if s <= 15 or s >= 300 else 0.0,
            "grad/global_norm": lambda s: math.inf if s <= 15 or s >= 300 else 1.0,
        },
    )
    nonfinite = fired(feed(Detector(), columns, framing), "nonfinite")
    assert [(f.step, f.evidence["origin"]) for f in nonfinite] == [(300, "grads")]


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

    def lr(s: int) -> float:
        return 0.01 * 1.01**s

    columns = stream(
        range(1, 300), 0.01, **{"grad/global_norm": norm, "loss": lambda s: 1.0, "lr": lr}
    )
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
    # The learning rate of the very step it fired (escalated) at, whatever the framing.
    assert alert.evidence["lr"] == pytest.approx(lr(explosion[1][3]))
    assert alert.evidence["lr_first"] == pytest.approx(lr(1))


@pytest.mark.parametrize("seed", range(5))
@FRAMINGS
def test_noisy_healthy_gradients_raise_nothing(seed: int, framing: int | None) -> None:
    columns = stream(range(1, 3000), 0.01, **{"grad/global_norm": healthy_norm(seed)})
    assert fired(feed(Detector(), columns, framing), "grad_explosion") == []


def fine_tune(unfreeze: int, last: int, after: Callable[[int], float]) -> Stream:
    """A fine-tune's gradients as recorded (the figures of the healthy suite's
    ``finetune-unfrozen``): a new head on a frozen backbone, its noisy gradient norm around
    0.5, then from ``unfreeze`` the backbone's variables join and the norm is ``after(step)``,
    some 25x."""
    noise = random.Random(7)
    norm = {s: 0.5 * math.exp(noise.gauss(0, 0.3)) for s in range(1, unfreeze)}
    norm.update({s: after(s) * math.exp(noise.gauss(0, 0.3)) for s in range(unfreeze, last)})
    columns = stream(range(1, last), 0.01, **{"grad/global_norm": norm.__getitem__})
    return {**columns, **unfrozen(unfreeze, last, lambda s: norm[s] / 3)}


@FRAMINGS
def test_a_backbone_unfrozen_is_a_new_regime_not_an_explosion(framing: int | None) -> None:
    columns = fine_tune(400, 1000, lambda s: 12.5)
    assert fired(feed(Detector(), columns, framing), "grad_explosion") == []
    # The same jump without new variables joining is an explosion (the test can fail).
    same = {n: c for n, c in columns.items() if not n.startswith("grad/norm/conv_")}
    assert [f.severity for f in fired(feed(Detector(), same, framing), "grad_explosion")] == [
        "warning"
    ]


@FRAMINGS
def test_an_explosion_after_the_unfreeze_is_measured_from_the_new_regime(
    framing: int | None,
) -> None:
    columns = fine_tune(400, 800, lambda s: 12.5 if s < 600 else 12.5 * 1.2 ** (s - 600))
    found = fired(feed(Detector(), columns, framing), "grad_explosion")
    assert found and 600 < found[0].step < 625, [(f.step, f.severity) for f in found]
    assert found[0].evidence["baseline"] > 5 and found[0].evidence["baseline_since"] == 400


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
def test_vanishing_judged_alike_on_a_stored_stream_given_the_declared_order(
    framing: int | None,
) -> None:
    """Storage gives the series back alphabetically; the env's ``variable_order`` (the agent
    sends it in its hello) keeps the model order of a replay the live one. Here the names
    sort against depth, so the alphabetical order alone would not see the early layers."""

    def layer(depth: int) -> Callable[[int], float]:
        return lambda s: 10.0 ** (-8 + depth)

    paths = [f"block_{5 - i}/kernel" for i in range(6)]  # block_5 the input's, block_0 last
    columns = stream(range(1, 400), 0.01, loss=lambda s: 2.3026 + 0.001 * math.sin(s))
    columns.update(
        stream(
            range(10, 400, 10), 0.01, **{f"grad/norm/{p}": layer(i) for i, p in enumerate(paths)}
        )
    )
    stored = dict(sorted(columns.items()))
    env = {"variable_order": paths}

    def alerts(columns: Stream, env: dict[str, list[str]] | None) -> list[tuple[int, str]]:
        found = fired(feed(Detector(env=env), columns, framing), "grad_vanishing")
        return [(f.step, str(f.evidence["early_variable"])) for f in found]

    live = alerts(columns, None)
    assert live and live[0][1] == "block_5/kernel", live
    assert alerts(stored, env) == live == alerts(columns, env)
    assert alerts(stored, None) != live  # the test reads the order: without it, it differs


def bert_layers(attention: float) -> dict[str, Callable[[int], float]]:
    """A one-layer BERT's kernels in model order, as the zoo's tiny ``keras_hub`` backbone
    has them at initialisation: the query and key kernels get 1e-6 of the pooler's gradient,
    the rest of the transformer layer ``attention`` of it."""
    block = "transformer_layer_0/self_attention_layer"
    norms = {
        f"{block}/query/kernel": 1e-6,
        f"{block}/key/kernel": 1e-6,
        f"{block}/value/kernel": attention,
        f"{block}/attention_output/kernel": attention,
        "transformer_layer_0/feedforward_intermediate_dense/kernel": attention,
        "transformer_layer_0/feedforward_output_dense/kernel": attention,
        "pooled_dense/kernel": 1.0,
        "dense/kernel": 0.8,
    }

    def constant(value: float) -> Callable[[int], float]:
        return lambda s: value

    return {f"grad/norm/{k}": constant(v) for k, v in norms.items()}


@pytest.mark.parametrize(("attention", "fires"), [(1e-2, False), (1e-6, True)])
def test_an_attention_layer_is_starved_only_with_all_its_kernels(
    attention: float, fires: bool
) -> None:
    """Small query and key gradients at initialisation are how attention starts, not
    vanishing: the layer's other kernels still learn. The whole layer starved is."""
    columns = stream(range(1, 400), 0.01, loss=lambda s: 1.0986 + 0.001 * math.sin(s))
    columns.update(stream(range(10, 400, 10), 0.01, **bert_layers(attention)))
    found = fired(feed(Detector(), columns, 40), "grad_vanishing")
    assert bool(found) == fires, found
    if fires:
        assert found[0].evidence["early_variable"] == "transformer_layer_0"
        assert found[0].evidence["top_variable"] == "pooled_dense/kernel"


def test_layers_are_told_apart_below_the_models_own_name() -> None:
    """A subclassed model names its variables ``net/<layer>/kernel``: the layers are what
    follows the name they share."""
    layers = {
        k.replace("grad/norm/", "grad/norm/net/"): f for k, f in deep_sigmoid_layers().items()
    }
    columns = stream(range(1, 400), 0.01, loss=lambda s: 2.3026 + 0.001 * math.sin(s))
    columns.update(stream(range(10, 400, 10), 0.01, **layers))
    found = fired(feed(Detector(), columns, 40), "grad_vanishing")
    assert found and found[0].evidence["early_variable"] == "net/dense_0/kernel", found


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
    assert "lr" not in book.alerts[("loss_divergence", "")].evidence  # none recorded
    divergence = [c for c in changes if c[1] == "loss_divergence"]
    assert divergence[0][:3] == ("fired", "loss_divergence", "warning")
    assert 400 < divergence[0][3] < 520
    assert ("updated", "loss_divergence", "critical") == divergence[1][:3]
    assert book.alerts[("loss_divergence", "")].evidence["start"] == pytest.approx(0.77, rel=0.2)


@FRAMINGS
def test_a_negative_loss_that_diverges_says_how_far_above_its_minimum(framing: int | None) -> None:
    """A log-likelihood loss falls below zero; the message gave a ratio to that minimum, which
    means nothing there ("infx its minimum -2.92"). It says how far above the minimum now."""
    noise = random.Random(5)

    def loss(s: int) -> float:
        level = -3.0 + 4.0 * math.exp(-s / 800) + max(0, s - 3000) / 300
        return level + noise.gauss(0, 0.1)

    book, changes = run_through(Detector(), stream(range(0, 6000), 0.05, loss=loss), framing)
    assert next(c[:3] for c in changes if c[1] == "loss_divergence") == (
        "fired", "loss_divergence", "warning"
    )  # fmt: skip
    alert = book.alerts[("loss_divergence", "")]
    assert alert.evidence["minimum"] < 0
    assert "inf" not in alert.message and "above its minimum -" in alert.message, alert.message


@FRAMINGS
def test_a_loss_that_jumps_back_to_its_start_warns_within_fifty_steps(framing: int | None) -> None:
    """The issue's learning-rate ramp (six ReLU layers, SGD, x1.006 a step, seed 2) as
    recorded: a mean-squared loss that falls from 8 to about 2 while swinging ever wider as
    the rate grows, then at step 628 jumps back to where it started (the network has
    collapsed) 140 steps before the first NaN. The swings before the jump are no reason to
    wait until the window holds nothing else."""
    noise = random.Random(2)

    def loss(s: int) -> float:
        if s >= 628:
            return 8.0 * math.exp(noise.gauss(0, 0.3))
        level = 8.0 * math.exp(-s / 80) + 1.8
        swing = 0.2 + 0.5 * min(s / 600, 1.0)  # wider as the rate grows
        return level * math.exp(noise.gauss(0, swing))

    found = fired(
        feed(Detector(), stream(range(1, 768), 0.01, loss=loss), framing), "loss_divergence"
    )
    assert found and 628 < found[0].step <= 678, [(f.step, f.severity) for f in found]


@FRAMINGS
def test_labels_gone_bad_at_once_warn_within_fifteen_steps(framing: int | None) -> None:
    """The zoo's label noise on a regression (targets shuffled and scaled from step 400): the
    loss leaps from its minimum past its start in a few steps, and its 11-step median is back
    at its start 10-30 steps later. Waiting for the 25-step level and 25 steps of rise would
    warn after that."""
    noise = random.Random(7)

    def loss(s: int) -> float:
        level = 0.12 + 0.3 * math.exp(-s / 60) if s < 400 else 1.1
        return level * math.exp(noise.gauss(0, 0.25))

    findings = feed(Detector(), stream(range(1, 600), 0.01, loss=loss), framing)
    found = [f for f in fired(findings, "loss_divergence") if f.subject == ""]
    assert found and 400 < found[0].step <= 415, [(f.step, f.severity) for f in found]
    assert found[0].evidence["level"] > found[0].evidence["start"]  # the level that leapt


@FRAMINGS
def test_a_run_that_learned_little_warns_before_its_loss_is_back_at_its_start(
    framing: int | None,
) -> None:
    """A classifier that went from 1.7 to 1.25 (less than min_ratio's 1.5x) and then loses it
    to labels going wrong: half of what it learned given back is the bar, else only a loss
    already back at its start could fire."""
    noise = random.Random(11)

    def loss(s: int) -> float:
        level = 1.25 + 0.6 * math.exp(-s / 80) if s < 500 else min(2.3, 1.25 + (s - 500) / 400)
        return level * math.exp(noise.gauss(0, 0.05))

    found = fired(
        feed(Detector(), stream(range(1, 1000), 0.01, loss=loss), framing), "loss_divergence"
    )
    assert found and found[0].severity == "warning", [(f.step, f.severity) for f in found]
    assert found[0].evidence["level"] < found[0].evidence["start"]  # before it is all lost


def labels_going_wrong(seed: int, batch: int, at: int) -> Callable[[int], float]:
    """A small-batch classifier's loss (the mean of ``batch`` examples' losses): learned to
    about 0.1 an example, then from ``at`` a share of wrong labels growing to 80% over 400
    steps, each costing about 3 (the model is sure of the right class)."""
    noise = random.Random(seed)

    def loss(s: int) -> float:
        wrong = 0.8 * min(1.0, max(0, s - at) / 400)
        level = 0.1 + 2.2 * math.exp(-s / 60)
        return (
            sum(
                3.0 * math.exp(noise.gauss(0, 0.3))
                if noise.random() < wrong
                else level * math.exp(noise.gauss(0, 1.0))
                for _ in range(batch)
            )
            / batch
        )

    return loss


@FRAMINGS
def test_labels_going_wrong_a_few_at_a_time_warn_from_the_tail_before_the_median(
    framing: int | None,
) -> None:
    """Batches of 16 whose labels go wrong a few at a time: the batches holding one grow
    many long before the median batch is much worse, so the losses over the upper quantile
    of the ones before count first, while the level (a median) has barely moved."""
    from trainvitals.detect.settings import LossDivergence, RuleSet

    def first(detector: Detector) -> Finding:
        columns = stream(range(1, 1000), 0.01, loss=labels_going_wrong(5, 16, 500))
        found = fired(feed(detector, columns, framing), "loss_divergence")
        alarms = [f for f in found if f.severity != "info"]
        assert alarms, "nothing fired"
        return alarms[0]

    tail = first(Detector())
    median_only = first(Detector(RuleSet(loss_divergence=LossDivergence(tail_p=0.0))))
    assert "of the last 30 losses were above the 90th percentile" in tail.message
    assert tail.evidence["tail"] >= 15 and tail.evidence["tail_of"] == 30
    assert 500 < tail.step <= median_only.step - 30, (tail.step, median_only.step)


@pytest.mark.parametrize("seed", range(10))
def test_a_heavy_tailed_small_batch_loss_on_a_long_plateau_raises_nothing(seed: int) -> None:
    """Losses drawn alike for 4,000 steps, one batch in ten far above the rest: the tail's
    count is judged against what losses drawn alike give, whatever their distribution."""
    noise = random.Random(seed)

    def loss(s: int) -> float:
        level = 0.2 + 2.0 * math.exp(-s / 60)
        return level * (8.0 if noise.random() < 0.1 else math.exp(noise.gauss(0, 0.5)))

    findings = feed(Detector(), stream(range(1, 4000), 0.01, loss=loss), 40)
    assert [f.message for f in findings if f.firing and f.severity != "info"] == []


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

    def rate(s: int) -> float:  # from zero over 30 steps, then cosine warm restarts
        return 1e-3 * s / 30 if s < 30 else 1e-3 * 0.5 * (1 + math.cos(math.pi * (s % 500) / 500))

    findings = feed(Detector(), stream(range(1, 2000), 0.01, loss=loss, lr=rate), framing)
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


def test_a_small_batch_loss_of_two_kinds_on_a_plateau_raises_nothing() -> None:
    """The zoo's healthy tiny BERT (three classes, batches of 4, AdamW): a batch's loss is
    near zero or one wrong answer's (0.5), so most steps go from one near zero to another.
    The spread taken from step to step is small, yet a median of five lands on the wrong
    answers' kind now and then: the leap must take the losses' quartiles as its noise."""
    path = Path(__file__).parent / "recorded" / "healthy-tiny-bert-batch-4.json.gz"
    stream, env = framing.load(path)
    raised = framing.raised(stream, framing.by_seconds(stream), env)
    assert {severity for _, _, severity, _ in raised} == {"info"}, raised  # its spikes


def test_an_autopsys_verdict_becomes_one_clean_line_with_its_causes_remedy() -> None:
    """The verdict comes from the agent over the wire: a control character or a line
    separator in it would forge a log line or colour a terminal."""
    from trainvitals.detect.numeric import CAUSE_HINTS, cause_said

    said = cause_said({"cause": "layer", "step": 4, "verdict": "Layer \x1b[31m'x'\u2028forged\n"})
    assert said == ("NaN/Inf at step 4: Layer [31m'x' forged", CAUSE_HINTS["layer"])
    assert cause_said({"cause": "made-up", "verdict": "x"}) is None


def test_vanishing_is_judged_on_the_losses_up_to_its_sample_however_framed() -> None:
    """The loss falls until step 150, then stays flat: the flat-loss test at a per-variable
    sample reads the losses up to that sample, never the later ones of its frame."""
    layers = deep_sigmoid_layers()
    columns = stream(range(1, 600), 0.01, loss=lambda s: 2.3 / min(s, 150) ** 0.5)
    columns.update(stream(range(10, 600, 10), 0.01, **layers))
    steps = {
        framing: [c[3] for c in run_through(Detector(), columns, framing)[1]]
        for framing in (1, 3, 40, 250, None)
    }
    assert len(set(map(tuple, steps.values()))) == 1 and steps[1], steps


def test_every_kernel_gradient_exactly_zero_with_a_flat_loss_is_vanishing() -> None:
    """Dead ReLUs everywhere: no kernel gets a gradient, only the output's bias still moves
    (so the global norm stays well above zero)."""
    kernels = {f"grad/norm/relu_{i}/kernel": (lambda s: 0.0 if s >= 100 else 0.5) for i in range(4)}
    columns = stream(range(1, 600), 0.01, loss=lambda s: 0.7 + 0.01 * math.sin(s))
    columns.update(stream(range(1, 600), 0.01, **{"grad/global_norm": lambda s: 0.5}))
    columns.update(stream(range(10, 600, 10), 0.01, **kernels))
    found = fired(feed(Detector(), columns, 40), "grad_vanishing")
    assert found and "exactly zero" in found[0].message, found
    assert found[0].evidence["ratio"] == 0.0 and found[0].step == 140  # 5 samples: 100..140


def test_relus_a_rising_learning_rate_killed_are_not_called_vanishing() -> None:
    """The same dead kernels after the rate rose tenfold and the loss climbed from its best:
    the rate's rules name that death, not grad_vanishing with a remedy for deep stacks. A
    rate that stays put, or a loss that stays near its best, leaves the rule as it was."""

    def dead_network(lr: Callable[[int], float], loss: Callable[[int], float]) -> list[Finding]:
        dead = {f"grad/norm/relu_{i}/kernel": lambda s: 0.0 if s >= 300 else 0.5 for i in range(4)}
        columns = stream(range(1, 700), 0.01, loss=loss, lr=lr)
        columns.update(stream(range(1, 700), 0.01, **{"grad/global_norm": lambda s: 0.5}))
        columns.update(stream(range(10, 700, 10), 0.01, **dead))
        return fired(feed(Detector(), columns, 40), "grad_vanishing")

    def rising(s: int) -> float:
        return 1e-3 * (10 if s >= 250 else 1)

    def climbing(s: int) -> float:
        return 0.3 if s < 250 else 1.2 + 0.01 * math.sin(s)

    assert not dead_network(rising, climbing)
    assert dead_network(lambda s: 1e-3, climbing)
    assert dead_network(rising, lambda s: 0.7 + 0.01 * math.sin(s))
