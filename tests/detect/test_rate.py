"""The learning rate rising again once its warm-up is over (``grad_explosion``, subject
``lr``): at the very step, however the stream is framed, and never on a healthy schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tests.detect.streams import fired, run_through, stream
from trainvitals.detect import Detector

STEPS = range(1, 1500)


def cosine_with_warmup(s: int) -> float:
    """From zero to 1e-3 over 100 steps (a thousandfold), then a cosine to a tenth."""
    if s < 100:
        return 1e-3 * s / 100
    return 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * (s - 100) / 1400))


HEALTHY: dict[str, Callable[[int], float]] = {
    "constant": lambda s: 0.05,
    "cosine with warm-up": cosine_with_warmup,
    "warm restarts": lambda s: 1e-4 + 1e-3 * 0.5 * (1 + math.cos(math.pi * (s % 300) / 300)),
    "step decay": lambda s: 0.1 * 0.5 ** (s // 400),
    "one cycle": lambda s: 1e-4 + 1e-3 * (s / 450 if s < 450 else max(0.0, 1 - (s - 450) / 1000)),
    "warm-up by epochs": lambda s: 1e-3 * min(10, 1 + s // 100) / 10,
    "float32 rounding": lambda s: float(f"{1e-3 * (1 + 1e-7 * (s % 3)):.9g}"),
}


@pytest.mark.parametrize("schedule", HEALTHY.values(), ids=HEALTHY.keys())
def test_healthy_schedules_raise_no_rate_alert(schedule: Callable[[int], float]) -> None:
    columns = stream(STEPS, 0.01, lr=schedule)
    assert run_through(Detector(), columns, 40)[1] == []


def test_a_rate_thirty_times_higher_after_the_warm_up_warns_at_that_step() -> None:
    def jumped(s: int) -> float:
        return cosine_with_warmup(s) * (30 if s >= 700 else 1)

    columns = stream(STEPS, 0.01, lr=jumped)
    changes = {
        framing: run_through(Detector(), columns, framing)[1] for framing in (1, 7, 40, None)
    }
    assert changes[None] == [("fired", "grad_explosion", "warning", 700)], changes
    assert all(c == changes[None] for c in changes.values()), changes
    alert = fired(Detector().feed(columns), "grad_explosion")[0]
    # measured against the highest rate before (the warm-up's peak), not the one just before
    expected = jumped(700) / 1e-3
    assert alert.subject == "lr" and alert.evidence["ratio"] == pytest.approx(expected)
    assert "learning rate rose" in alert.message


def test_a_rate_growing_slowly_warns_once_three_times_its_highest_and_clears_when_set_back() -> (
    None
):
    def growing(s: int) -> float:
        return 1e-3 * (1000 ** ((s - 600) / 500) if 600 <= s < 1100 else 1.0)

    _, changes = run_through(Detector(), stream(STEPS, 0.01, lr=growing), 40)
    assert [c[0] for c in changes] == ["fired", "resolved"]
    # x3 over 1e-3 once 1000^(t/500) >= 3: t = 80 steps after the rise began
    assert 675 <= changes[0][3] <= 685 and changes[1][3] == 1100, changes
