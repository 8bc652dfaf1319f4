"""``loss_above_chance``: a classifier whose loss starts far above what guessing gives."""

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


def test_without_a_loss_at_chance_in_the_env_nothing_is_judged() -> None:
    """A regression, a custom loss, a custom loop: the agent sent no level to compare with."""
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
