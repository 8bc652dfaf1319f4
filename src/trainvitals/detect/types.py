"""What flows through the detection core: records in, findings out, alerts kept."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


def worse(a: Severity, b: Severity) -> Severity:
    """The more severe of two severities."""
    return a if SEVERITIES.index(a) >= SEVERITIES.index(b) else b


@dataclass
class Record:
    """The values recorded together at one moment: one training step's vitals, or one
    per-second sample of the host and GPUs (filed under the latest step)."""

    step: int
    time: float
    values: dict[str, float]


@dataclass(frozen=True)
class Finding:
    """A rule's verdict on one subject: firing (with what to say), or clear again."""

    rule: str
    subject: str
    firing: bool
    step: int
    time: float
    severity: Severity = "warning"
    message: str = ""
    hint: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def clear(rule: str, subject: str, step: int, time: float) -> Finding:
    return Finding(rule, subject, False, step, time)


def jsonable(value: Any) -> Any:
    """Evidence as strict JSON: NaN and infinities become the strings "NaN", "Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
