"""The learning rate rising once its warm-up is over: a blow-up's first cause, seen before
the gradients or the loss show it.

Updates scale with the rate (plain SGD's exactly; Adam's step is the rate times a
normalised gradient), so a rate that rises to several times the highest training settled
at makes every update that much larger: the update-to-weight ratio jumps with it, and the
loss or the gradient norm turn a few to hundreds of steps later. Schedules rise during their
warm-up (from near zero, a thousandfold) and never after it; cyclic ones and warm restarts
come back to a peak they reached before.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from trainvitals.detect import settings as s


@dataclass(frozen=True)
class Rise:
    """The rate at a step, and the highest it had been ``lr_lag`` or more steps before."""

    step: int
    lr: float
    before: float

    @property
    def ratio(self) -> float:
        return self.lr / self.before


class RateWatch:
    """Fed the recorded learning rate step by step, says when it rises past ``lr_rise``
    times its highest ``lr_lag`` or more steps before, once it has not risen for
    ``lr_settle`` steps in a row (the warm-up is over), and when it is back below that."""

    def __init__(self, settings: s.GradExplosion) -> None:
        self.settings = settings
        self._last: float | None = None
        self._still = 0
        self._settled = False
        self._peak = 0.0
        self._lagging: deque[tuple[int, float]] = deque()
        #: The highest rate ``lr_lag`` steps back or more, once settled (0 before).
        self._before = 0.0
        #: The reference a firing rise is measured against, held until it is over.
        self.rising: Rise | None = None

    def feed(self, step: int, lr: float) -> bool:
        """Take the rate of ``step``; whether :attr:`rising` started or ended there."""
        cfg = self.settings
        if not (cfg.lr_rise > 0 and math.isfinite(lr) and lr > 0):
            return False
        self._lagging.append((step, lr))
        while self._lagging[0][0] <= step - cfg.lr_lag:
            self._before = max(self._before, self._lagging.popleft()[1])
        if not self._settled:
            # Not risen: equal within float32 rounding, or lower.
            rose = self._last is not None and lr > self._last * (1 + 1e-6)
            self._still = 0 if rose or self._last is None else self._still + 1
            self._last = lr
            self._peak = max(self._peak, lr)
            if self._still >= cfg.lr_settle:  # the warm-up's peak is no rise
                self._settled = True
                self._before = max(self._before, self._peak)
            return False
        if self.rising is None:
            if lr >= cfg.lr_rise * self._before:
                self.rising = Rise(step, lr, self._before)
                return True
        elif lr < cfg.lr_rise * self.rising.before:
            self.rising = None
            return True
        return False
