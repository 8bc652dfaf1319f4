"""What every rule shares: the run's context and the rule interface."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from trainvitals.detect.types import Finding, Record, Severity

#: Prefixes of per-second system series; everything else is a per-step vital.
SYSTEM_PREFIXES = ("host/", "gpu")


def is_system(name: str) -> bool:
    return name.startswith(SYSTEM_PREFIXES)


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


class Context:
    """Facts about the run that several rules read: environment, latest system readings,
    the order variables first appeared in (model order), and the step rate."""

    def __init__(self, env: Mapping[str, Any] | None = None) -> None:
        self.env: Mapping[str, Any] = env or {}
        self.latest: dict[str, float] = {}
        self.latest_time = 0.0
        self.step = 0
        self._variable_order: dict[str, int] = {}
        self._steps: deque[tuple[float, int]] = deque(maxlen=64)

    @property
    def mixed_precision(self) -> bool:
        return str(self.env.get("mixed_precision_policy", "")).startswith("mixed")

    def note(self, record: Record) -> None:
        stepped = False
        for name, value in record.values.items():
            if is_system(name):
                self.latest[name] = value
            elif name.startswith("grad/norm/") and name not in self._variable_order:
                self._variable_order[name] = len(self._variable_order)
            else:
                stepped = True
        if any(is_system(n) for n in record.values):
            self.latest_time = record.time
        if stepped and record.step > self.step:
            self.step = record.step
            self._steps.append((record.time, record.step))

    def in_model_order(self, names: Iterable[str]) -> list[str]:
        order = self._variable_order
        return sorted(names, key=lambda n: order.get(n, len(order)))

    @property
    def steps_per_second(self) -> float:
        if len(self._steps) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def memory_readings(self) -> dict[str, float]:
        """The latest host and GPU memory readings: evidence of how a run ended."""
        keys = ("rss", "available", "limit", "swap_used", "mem_used", "mem_total", "tf_current")
        return {k: v for k, v in self.latest.items() if k.rsplit("/", 1)[-1] in keys}


class Rule:
    """One alert rule: it sees every record in order and says when a subject starts or
    stops firing. Rules keep their own state and hysteresis; the lifecycle turns their
    findings into alerts."""

    id: ClassVar[str]

    def __init__(self, context: Context) -> None:
        self.context = context
        self.firing: dict[str, Severity] = {}  # subject -> severity, as last reported

    def observe(self, record: Record) -> list[Finding]:
        return []

    def fire(
        self,
        subject: str,
        record: Record,
        severity: Severity,
        message: str,
        hint: str,
        evidence: dict[str, Any],
    ) -> Finding:
        self.firing[subject] = severity
        return Finding(
            self.id, subject, True, record.step, record.time, severity, message, hint, evidence
        )

    def resolve(self, subject: str, record: Record) -> Finding:
        self.firing.pop(subject, None)
        return Finding(self.id, subject, False, record.step, record.time)
