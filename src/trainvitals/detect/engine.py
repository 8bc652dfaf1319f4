"""The detector of one run: points in, findings out. No I/O, no clock of its own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trainvitals.detect.base import Context, Rule
from trainvitals.detect.hardware import EnvMismatchRule, HardwareRule, ThermalRule
from trainvitals.detect.memory import MemoryPressureRule, OomForecastRule
from trainvitals.detect.numeric import (
    GradExplosionRule,
    GradVanishingRule,
    LossDivergenceRule,
    NonfiniteRule,
)
from trainvitals.detect.process import CrashRule, SlowdownRule, StallRule
from trainvitals.detect.settings import RuleSet
from trainvitals.detect.types import Finding, Record
from trainvitals.protocol import ArrayColumns, Columns, EndReason, SeqColumns
from trainvitals.series import (
    GPU_PREFIX,
    GRAD_GLOBAL_NORM,
    HOST_PREFIX,
    LOSS,
    LOSS_SCALE,
    LR,
    NONFINITE_PREFIX,
    STEP_TIME,
    is_system,
)

#: Series the rules read; the rest of a frame (accuracy, epoch values...) is skipped unseen.
_PREFIXES = ("grad/", NONFINITE_PREFIX, HOST_PREFIX, GPU_PREFIX)
_NAMES = frozenset((LOSS, STEP_TIME, LR, LOSS_SCALE))
_PER_STEP = frozenset((LOSS, STEP_TIME, GRAD_GLOBAL_NORM, LR, LOSS_SCALE))

#: A frame's points: series name -> (steps, times, values).


def watched(name: str) -> bool:
    return name in _NAMES or name.startswith(_PREFIXES)


def per_step(name: str) -> bool:
    """Series recorded at every step (as opposed to every few steps or every second)."""
    return name in _PER_STEP or name.startswith(NONFINITE_PREFIX)


class Detector:
    """Every enabled rule of one run, fed in the order the agent recorded.

    Example:
        ```python
        detector = Detector(RuleSet(), env=hello["env"])
        findings = detector.hello(step=0, time=hello["started_at"])
        findings += detector.feed({"loss": ([1, 2], [t1, t2], [0.7, float("nan")])})
        ```
    """

    def __init__(
        self,
        settings: RuleSet | None = None,
        env: Mapping[str, Any] | None = None,
        memory: Sequence[Rule] | None = None,
    ):
        """``memory``: the memory rules of the run's process (:class:`ProcessMemory`), shared
        with its other runs, instead of memory rules of the run's own."""
        self.settings = settings = settings or RuleSet()
        self.context = context = Context(env)
        self.nonfinite = NonfiniteRule(context, settings.nonfinite)
        self.stall_rule = StallRule(context, settings.stall)
        self.crash = CrashRule(context, settings.crash)
        self.env_mismatch = EnvMismatchRule(context, settings.env_mismatch)
        if memory is None:
            memory = [
                rule
                for enabled, rule in (
                    (
                        settings.oom_forecast.enabled,
                        OomForecastRule(context, settings.oom_forecast),
                    ),
                    (
                        settings.memory_pressure.enabled,
                        MemoryPressureRule(context, settings.memory_pressure),
                    ),
                )
                if enabled
            ]
        candidates: list[tuple[bool, Rule]] = [
            (settings.nonfinite.enabled, self.nonfinite),
            (settings.grad_explosion.enabled, GradExplosionRule(context, settings.grad_explosion)),
            (settings.grad_vanishing.enabled, GradVanishingRule(context, settings.grad_vanishing)),
            (
                settings.loss_divergence.enabled,
                LossDivergenceRule(context, settings.loss_divergence),
            ),
            *((True, rule) for rule in memory),
            (settings.stall.enabled, self.stall_rule),
            (settings.slowdown.enabled, SlowdownRule(context, settings.slowdown)),
            (settings.thermal.enabled, ThermalRule(context, settings.thermal)),
            (settings.hardware.enabled, HardwareRule(context, settings.hardware)),
        ]
        self.rules = [rule for enabled, rule in candidates if enabled]
        self._readers: dict[tuple[str, ...], list[Rule]] = {}

    def hello(self, step: int, time: float) -> list[Finding]:
        """Check the environment the agent described."""
        if not self.settings.env_mismatch.enabled:
            return []
        return self.env_mismatch.check(self.context.env, step, time)

    def feed(self, points: Mapping[str, SeqColumns]) -> list[Finding]:
        """Judge one frame's points in the order they were recorded.

        The per-step series (loss, gradient norm, NaN/Inf counts, step time) are offered to
        each rule in bulk first (:meth:`Rule.skim`); a rule that sees something worth a
        closer look gets them again step by step. Per-variable norms and system samples
        always go record by record.
        """
        points = {name: column for name, column in points.items() if watched(name)}
        # Series that share their steps and times (the wire's clocks) share the very lists:
        # each becomes an array once.
        arrays: dict[tuple[int, type], Any] = {}

        def array(column: Sequence[Any], dtype: type) -> Any:
            converted = arrays.get((id(column), dtype))
            if converted is None:
                converted = arrays[(id(column), dtype)] = np.asarray(column, dtype=dtype)
            return converted

        dense: Mapping[str, ArrayColumns] = {
            name: Columns(
                array(steps, np.int64),
                array(times, np.float64),
                np.asarray(values, dtype=np.float64),
            )
            for name, (steps, times, values) in points.items()
            if per_step(name) and len(steps)
        }
        findings: list[Finding] = []
        closer: list[Rule] = []
        if dense:
            self.context.note_dense(dense)
            for rule in self._readers_of(tuple(dense)):
                found = rule.skim(dense)
                if found is None:
                    closer.append(rule)
                else:
                    findings.extend(found)
        sparse = {
            name: _thinned(column) if is_system(name) else column
            for name, column in points.items()
            if not per_step(name)
        }
        for record in records(sparse):
            self.context.note(record)
            for rule in self._readers_of(tuple(record.values)):
                if rule not in closer:
                    findings.extend(rule.observe(record))
        if closer:
            for record in records(points):
                for rule in self._readers_of(tuple(record.values)):
                    if rule in closer:
                        findings.extend(rule.observe(record))
        return findings

    def _readers_of(self, names: tuple[str, ...]) -> list[Rule]:
        # Records of one kind share their names (a step's vitals, a system sample): which
        # rules read them is worked out once per set of names.
        rules = self._readers.get(names)
        if rules is None:
            rules = self._readers[names] = [
                rule for rule in self.rules if any(rule.reads(n) for n in names)
            ]
        return rules

    def stalled(
        self, step: int, time: float, idle: float, threshold: float, stacks: str
    ) -> list[Finding]:
        if not self.settings.stall.enabled:
            return []
        return [self.stall_rule.stalled(step, time, idle, threshold, stacks)]

    def ended(self, reason: str, time: float, traceback: str | None = None) -> list[Finding]:
        """The run ended with ``reason``; anything but ``completed`` is a crash."""
        if reason == EndReason.COMPLETED or not self.settings.crash.enabled:
            return []
        return [self.crash.ended(reason, time, traceback)]


#: System samples closer together than this (seconds) are judged by the last of them: the
#: agent samples once a second, and a client sending far faster must not cost the server
#: more than 25 samples a second of judging.
SYSTEM_MIN_INTERVAL = 0.04


def _thinned(column: SeqColumns) -> SeqColumns:
    steps, times, values = column
    if len(times) < 2:
        return column
    bucket = np.floor(np.asarray(times, dtype=np.float64) / SYSTEM_MIN_INTERVAL)
    keep = np.flatnonzero(np.diff(bucket, append=np.inf) != 0).tolist()  # each bucket's last
    if len(keep) == len(times):
        return column
    return Columns([steps[i] for i in keep], [times[i] for i in keep], [values[i] for i in keep])


def records(points: Mapping[str, SeqColumns]) -> Iterable[Record]:
    """Regroup a frame's columns into the records the agent logged: the values that share
    a step and a time were recorded together (one step's vitals, or one system sample)."""
    grouped: dict[tuple[int, float], dict[str, float]] = {}
    for name, (steps, times, values) in points.items():
        if not watched(name):
            continue
        for step, time, value in zip(steps, times, values, strict=True):
            key = (step, time)
            group = grouped.get(key)
            if group is None:
                group = grouped[key] = {}
            group[name] = value
    for (step, time), group in sorted(grouped.items(), key=lambda item: (item[0][1], item[0][0])):
        yield Record(step, time, group)
