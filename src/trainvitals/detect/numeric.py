"""Rules on the numbers of training itself: NaN/Inf (``nonfinite.py``), gradient norms
(``gradients.py``) and the loss (``loss.py``), gathered under their first module's name."""

from __future__ import annotations

from trainvitals.detect.gradients import (
    GRAD_EXPLOSION_HINT,
    GRAD_VANISHING_HINT,
    GradExplosionRule,
    GradVanishingRule,
)
from trainvitals.detect.loss import LOSS_DIVERGENCE_HINT, LOSS_SPIKE_HINT, LossDivergenceRule
from trainvitals.detect.nonfinite import (
    CAUSE_HINTS,
    NONFINITE_HINTS,
    ORIGINS,
    NonfiniteRule,
    cause_said,
    loss_scale_skip,
)

__all__ = [
    "CAUSE_HINTS",
    "GRAD_EXPLOSION_HINT",
    "GRAD_VANISHING_HINT",
    "LOSS_DIVERGENCE_HINT",
    "LOSS_SPIKE_HINT",
    "NONFINITE_HINTS",
    "ORIGINS",
    "GradExplosionRule",
    "GradVanishingRule",
    "LossDivergenceRule",
    "NonfiniteRule",
    "cause_said",
    "loss_scale_skip",
]
