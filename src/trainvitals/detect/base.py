"""What every rule shares: the run's context and the rule interface."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from trainvitals.detect.types import Finding, Record, Severity
from trainvitals.protocol import VARIABLE_ORDER, ArrayColumns
from trainvitals.series import GRAD_NORM_PREFIX, LR, STEP_TIME, is_system

#: Kinds of record (sets of names) whose facts are worked out once and kept: a client that
#: sends ever other names only makes them be worked out again.
KINDS_KEPT = 64

#: Prefixes of per-second system series; everything else is a per-step vital.


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def last_record(dense: Mapping[str, ArrayColumns], name: str) -> Record:
    """The moment of a series' last point in a frame, for findings made in bulk."""
    steps, times, _ = dense[name]
    return Record(int(steps[-1]), float(times[-1]), {})


def declared_order(env: Mapping[str, Any]) -> dict[str, int]:
    """The per-variable norms' series names -> their place in the model, from the env's
    ``variable_order`` (the trainable variables' paths in model order); empty when absent or
    not a list of strings."""
    paths = env.get(VARIABLE_ORDER)
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return {}
    order: dict[str, int] = {}
    for path in paths:
        order.setdefault(GRAD_NORM_PREFIX + path, len(order))
    return order


class Context:
    """Facts about the run that several rules read: environment, latest system readings,
    the model order of the variables, the step rate and the learning rate."""

    def __init__(self, env: Mapping[str, Any] | None = None) -> None:
        self.env: Mapping[str, Any] = env or {}
        self.latest: dict[str, float] = {}
        self.latest_time = 0.0
        #: The last step's time (seconds), or None before the first.
        self.step_time: float | None = None
        self.step = 0
        self._variable_order: dict[str, int] = {}
        #: Each per-variable norm's place in the model as the agent declared it in the env's
        #: ``variable_order``: stored streams list their series alphabetically, so the order
        #: they first appear in is the model's only live.
        self._declared_order = declared_order(self.env)
        #: A record's names -> (its system series, whether it is a step's): :meth:`note`.
        self._kinds: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {}
        #: The step at which variables never trained before last joined mid-run (a backbone
        #: unfrozen for fine-tuning), or None: the run's gradients and step times before it
        #: are no baseline for those after it.
        self.trained_from: int | None = None
        self._steps: deque[tuple[float, int]] = deque(maxlen=64)
        #: The optimizer's first recorded learning rate; None until the agent records ``lr``.
        self.lr_first: float | None = None
        # The rates of the frame being judged, and the last one of the frames before it.
        self._lr: tuple[Any, Any] | None = None
        self._lr_before: float | None = None

    @property
    def mixed_precision(self) -> bool:
        return str(self.env.get("mixed_precision_policy", "")).startswith("mixed")

    def note(self, record: Record) -> None:
        values = record.values
        names = tuple(values)
        kind = self._kinds.get(names)
        if kind is None:  # the first record of its kind: its new variables are noted too
            kind = self._kind(names, record.step)
        system, stepped = kind
        for name in system:
            self.latest[name] = values[name]
        if system:
            self.latest_time = record.time
        if stepped and record.step > self.step:
            self.step = record.step
            self._steps.append((record.time, record.step))

    def _kind(self, names: tuple[str, ...], step: int) -> tuple[tuple[str, ...], bool]:
        """A kind of record (the set of names it holds): its system series, and whether it is
        a step's. Its per-variable norms never seen before join the model order."""
        trained = bool(self._variable_order)  # the first per-variable norms are no change
        for name in names:
            if name.startswith(GRAD_NORM_PREFIX) and name not in self._variable_order:
                self._variable_order[name] = len(self._variable_order)
                if trained:
                    self.trained_from = step
        system = tuple(name for name in names if is_system(name))
        if len(self._kinds) >= KINDS_KEPT:  # a client sending ever other names
            self._kinds.clear()
        kind = self._kinds[names] = system, len(system) < len(names)
        return kind

    def note_dense(self, dense: Mapping[str, ArrayColumns]) -> None:
        rates = dense.get(LR)
        if rates is not None:
            steps, _, values = rates
            keep = np.isfinite(values)
            if keep.any():
                if self._lr is not None:
                    self._lr_before = float(self._lr[1][-1])
                self._lr = (steps[keep], values[keep])
                if self.lr_first is None:
                    self.lr_first = float(values[keep][0])
        steps, times, _ = max(dense.values(), key=lambda column: len(column[0]))
        if len(steps) and int(steps[-1]) > self.step:
            self.step = int(steps[-1])
            self._steps.append((float(times[-1]), self.step))
        step_time = dense.get(STEP_TIME)
        if step_time is not None and len(step_time[2]):
            self.step_time = float(step_time[2][-1])

    def in_model_order(self, names: Iterable[str]) -> list[str]:
        """``names`` in model order: as the env declares it, else (an agent that does not
        declare it, a name it left out: after those it does) in the order first seen."""
        declared, seen = self._declared_order, self._variable_order
        return sorted(names, key=lambda n: (declared.get(n, len(declared)), seen.get(n, len(seen))))

    @property
    def steps_per_second(self) -> float:
        if len(self._steps) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._steps[0], self._steps[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def lr_at(self, step: int) -> float | None:
        """The learning rate recorded at ``step`` or the last step before it."""
        if self._lr is None:
            return None
        steps, values = self._lr
        i = int(np.searchsorted(steps, step, side="right")) - 1
        return float(values[i]) if i >= 0 else self._lr_before

    def lr_evidence(self, step: int) -> dict[str, float]:
        """The learning rate at ``step`` and at the start, for the evidence of the rules a
        rate too high sets off (explosion, divergence); empty when the run records none."""
        lr = self.lr_at(step)
        if lr is None or self.lr_first is None:
            return {}
        return {"lr": lr, "lr_first": self.lr_first}

    def memory_readings(self) -> dict[str, float]:
        """The latest host and GPU memory readings: evidence of how a run ended."""
        keys = (
            *("working_set", "rss", "rss_anon", "rss_file", "available", "limit", "swap_used"),
            *("mem_used", "mem_total", "tf_current"),
        )
        return {k: v for k, v in self.latest.items() if k.rsplit("/", 1)[-1] in keys}


class Rule:
    """One alert rule: it sees every record in order and says when a subject starts or
    stops firing. Rules keep their own state and hysteresis; the lifecycle turns their
    findings into alerts."""

    id: ClassVar[str]
    #: The series this rule reads: exact names, and prefixes ending in "/" or "gpu".
    watches: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def reads(cls, name: str) -> bool:
        prefixes = tuple(w for w in cls.watches if w.endswith("/") or w == "gpu")
        return name in cls.watches or name.startswith(prefixes)

    def __init__(self, context: Context) -> None:
        self.context = context
        self.firing: dict[str, Severity] = {}  # subject -> severity, as last reported
        #: The change of the trained variables this rule last started again from.
        self.regime: int | None = None

    @property
    def regime_pending(self) -> bool:
        """Whether the trained variables changed since this rule last started again: a rule
        that keeps a baseline of the run's steps judges the next frame step by step, to
        start again at the very step (:meth:`new_regime`)."""
        return self.context.trained_from != self.regime

    def new_regime(self, step: int) -> bool:
        """Whether ``step`` is the first this rule sees of a new regime (variables never
        trained before joined at or before it); then the regime counts as seen."""
        since = self.context.trained_from
        if since is None or since == self.regime or step < since:
            return False
        self.regime = since
        return True

    def observe(self, record: Record) -> list[Finding]:
        return []

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        """Take a frame's per-step series in bulk when nothing in them can change this rule's
        mind; return None to have them replayed step by step through :meth:`observe`.

        A fast agent sends hundreds of steps a frame and the server judges every frame of
        every run, so the common case (healthy numbers) is one pass of array arithmetic.
        """
        return None

    def fire(
        self,
        subject: str,
        record: Record,
        severity: Severity,
        message: str,
        hint: str,
        evidence: Mapping[str, object],
    ) -> Finding:
        self.firing[subject] = severity
        return Finding(
            self.id,
            subject,
            True,
            record.step,
            record.time,
            severity,
            message,
            hint,
            dict(evidence),
        )

    def resolve(self, subject: str, record: Record) -> Finding:
        self.firing.pop(subject, None)
        return Finding(self.id, subject, False, record.step, record.time)
