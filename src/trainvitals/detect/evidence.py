"""The evidence some rules attach to their alerts, typed: what each key holds.

An alert's evidence goes to the dashboard, the API and the channels as JSON; docs/alerts.md
names each key. A rule builds one of these and :meth:`Rule.fire` takes it as it is.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class NonfiniteEvidence(TypedDict):
    """``nonfinite``: where NaN/Inf appeared first and what was finite before it."""

    origin: str
    where: list[str]
    counts: dict[str, float]
    first_step: int
    steps_nonfinite: int
    last_finite_loss: float | None
    last_grad_norm: float | None
    variables: NotRequired[list[str]]


class SlowdownEvidence(TypedDict):
    """``slowdown``: the recent median step time against the baseline, and what may explain
    it from the latest system readings."""

    step_time: float
    baseline: float
    ratio: float
    swap_used: NotRequired[float]
    throttle: NotRequired[dict[str, float]]
    cpu_percent: NotRequired[float]


class CrashEvidence(TypedDict):
    """``crash``: how the run ended, at which step, with the last memory readings."""

    end_reason: str
    last_step: int
    last_readings: NotRequired[dict[str, float]]
    exception: NotRequired[str]


class ThermalEvidence(TypedDict):
    """``thermal``: a GPU's temperature and throttle-reason bits."""

    temp: float | None
    throttle: int
    reasons: list[str]
    clock_sm: NotRequired[float]


class Forecast(TypedDict):
    """The fitted trend to draw: from now to the limit, in time and in steps."""

    series: str
    time: list[float]
    step: list[int]
    value: list[float]


class OomEvidence(TypedDict):
    """``oom_forecast``: the memory trend and when it reaches the limit."""

    series: str
    current: float
    limit: float
    fraction: float
    slope: float
    eta_s: float
    agreement: float
    window_s: float
    trend: str
    forecast: Forecast
    fits: NotRequired[int]
    growth_per_fit: NotRequired[float]
