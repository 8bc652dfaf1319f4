"""``loss_above_chance``: a model whose loss starts far above what guessing gives (a
classifier's level in its hello, a regression's measured batch by batch)."""

from __future__ import annotations

import functools
import math

import pytest

from tests.detect.streams import FRAMINGS, feed, fired, run_through, stream
from trainvitals.detect import Detector

TEN_CLASSES = {"loss_at_chance": {"loss": "sparse_categorical_crossentropy", "classes": 10,
                                  "value": math.log(10)}}  # fmt: skip


def loss(step: int) -> float:
    """A loss that starts far above chance (10 classes) and falls under it by step 80."""
    return 4e4 * 0.9**step


@FRAMINGS
def test_a_loss_that_starts_far_above_chance_warns_once_its_first_steps_are_in(
    framing: int | None,
) -> None:
    columns = stream(
        range(1, 301),
        0.01,
        loss=lambda s: loss(s) if s < 150 else 1e3,  # learned, then lost it again
        **{"grad/global_norm": lambda s: 900.0},
    )
    book, changes = run_through(Detector(env=TEN_CLASSES), columns, framing)
    assert ("fired", "loss_above_chance", "warning", 20) in changes, changes
    alert = book.alerts[("loss_above_chance", "")]
    assert alert.evidence["loss_at_chance"] == pytest.approx(math.log(10))
    assert alert.evidence["classes"] == 10
    assert alert.evidence["loss_start"] == pytest.approx((loss(10) + loss(11)) / 2)  # median
    assert alert.evidence["grad_norm_start"] == 900.0
    assert "2.3" in alert.message and "10 classes" in alert.message
    # It learned all the same: the level of the last 20 under the bar resolves it.
    bar = 2 * math.log(10)
    under = next(n for n in range(20, 301) if (loss(n - 10) + loss(n - 9)) / 2 <= bar)
    assert ("resolved", "loss_above_chance", "warning", under) in changes, changes
    # Once: a loss that rises again later is loss_divergence's to judge.
    assert [c[0] for c in changes if c[1] == "loss_above_chance"] == ["fired", "resolved"]


@FRAMINGS
def test_a_loss_that_starts_at_chance_or_below_says_nothing(framing: int | None) -> None:
    for start in (2.4, 2 * math.log(10) - 0.01, 0.3):
        columns = stream(range(1, 200), 0.01, loss=functools.partial(falling, start))
        assert not fired(feed(Detector(env=TEN_CLASSES), columns, framing), "loss_above_chance")


def falling(start: float, step: int) -> float:
    return start * (1 - step / 400)


def test_without_a_loss_at_chance_nothing_is_judged() -> None:
    """A custom loss, a custom loop: the agent sent no level to compare with."""
    columns = stream(range(1, 200), 0.01, loss=lambda s: 1e6)
    assert not fired(feed(Detector(), columns, None), "loss_above_chance")
    for bad in (
        {"value": "2.3", "classes": 10},
        {"value": True, "classes": 10},
        {"value": 2.3, "classes": True},
        {"value": 2.3, "classes": 1},
    ):
        env = {"loss_at_chance": bad}
        assert not fired(feed(Detector(env=env), columns, None), "loss_above_chance"), bad


def test_non_finite_losses_are_not_counted_among_the_first() -> None:
    columns = stream(range(1, 60), 0.01, loss=lambda s: math.nan if s < 30 else 1e3)
    found = fired(feed(Detector(env=TEN_CLASSES), columns, None), "loss_above_chance")
    assert [f.step for f in found] == [49]


def regression_chance(step: int) -> float:
    """A regression's level as the agent measures it: each batch's own, about 1.5."""
    return 1.5 + 0.3 * math.sin(step)


@FRAMINGS
def test_a_regression_whose_loss_starts_far_above_its_level_warns(framing: int | None) -> None:
    """Weights drawn far too wide put a regression's loss at 1e11 from the first step: no
    rule comparing the run with itself sees anything but a steady run."""
    columns = stream(
        range(1, 301),
        0.01,
        loss=lambda s: 1.2e11 * (1 + 0.1 * math.cos(s)),
        loss_at_chance=regression_chance,
    )
    book, changes = run_through(Detector(), columns, framing)
    assert ("fired", "loss_above_chance", "warning", 20) in changes, changes
    alert = book.alerts[("loss_above_chance", "")]
    level = sorted(regression_chance(s) for s in range(1, 21))
    assert alert.evidence["loss_at_chance"] == pytest.approx((level[9] + level[10]) / 2)
    assert "classes" not in alert.evidence
    assert "guessing 1 or -1" in alert.message and "far too large" in alert.message
    assert "normalise" in alert.hint


@FRAMINGS
def test_a_regression_within_its_factor_of_its_level_says_nothing(framing: int | None) -> None:
    for start in (1.5, 9.9 * 1.5, 0.01):
        columns = stream(
            range(1, 200),
            0.01,
            loss=functools.partial(falling, start),
            loss_at_chance=lambda s: 1.5,
        )
        found = fired(feed(Detector(), columns, framing), "loss_above_chance")
        assert not found, start
    # Ten times the level, the regression's own factor, is where it starts to warn.
    columns = stream(range(1, 200), 0.01, loss=lambda s: 15.5, loss_at_chance=lambda s: 1.5)
    assert fired(feed(Detector(), columns, None), "loss_above_chance")


def test_a_regressions_level_is_read_on_the_steps_judged_and_no_later() -> None:
    """The first 20 finite losses span steps 1-40 here; a level measured after them (its
    first values were NaN: a batch of NaN targets) must not count, however the frames cut
    the stream, or whether the verdict comes from a frame judged whole or step by step."""
    columns = stream(
        range(1, 120),
        0.01,
        loss=lambda s: math.nan if s % 2 else 100.0,
        loss_at_chance=lambda s: math.nan if s < 35 else (1.0 if s <= 40 else 1e6),
    )
    outcomes = set()
    for framing in (None, 1, 7, 50):
        book, changes = run_through(Detector(), columns, framing)
        outcomes.add(tuple(c for c in changes if c[1] == "loss_above_chance"))
        assert ("fired", "loss_above_chance", "warning", 40) in changes, (framing, changes)
        assert book.alerts[("loss_above_chance", "")].evidence["loss_at_chance"] == 1.0
    assert len(outcomes) == 1
