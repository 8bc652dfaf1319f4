"""The detector of one run: points in, findings out. No I/O, no clock of its own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trainvitals.detect.base import Context, Rule
from trainvitals.detect.chance import LossAboveChanceRule
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
from trainvitals.protocol import (
    ArrayColumns,
    Clock,
    ClockedSeries,
    Columns,
    EndReason,
    SeqColumns,
)
from trainvitals.series import (
    CHANCE_LOSS,
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
_NAMES = frozenset((LOSS, STEP_TIME, LR, LOSS_SCALE, CHANCE_LOSS))
# A regression's loss at chance is recorded at each of the first steps only: judged with the
# losses of those steps, in bulk.
_PER_STEP = frozenset((LOSS, STEP_TIME, GRAD_GLOBAL_NORM, LR, LOSS_SCALE, CHANCE_LOSS))


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
            (
                settings.loss_above_chance.enabled,
                LossAboveChanceRule(context, settings.loss_above_chance),
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
        frame = ClockedSeries.of(points)
        watched_series = {name: on for name, on in frame.series.items() if watched(name)}
        # The per-step series as arrays, on the frame's clocks: each clock converted once.
        clocks: list[Clock[Any, Any]] = []
        at: dict[int, int] = {}  # the frame's clock -> its arrays' place in ``clocks``
        on_clocks: dict[str, tuple[int, Any]] = {}
        for name, (index, values) in watched_series.items():
            if not per_step(name) or not len(values):
                continue
            if index not in at:
                steps, times = frame.clocks[index]
                at[index] = len(clocks)
                clocks.append(Clock(np.asarray(steps, np.int64), np.asarray(times, np.float64)))
            on_clocks[name] = (at[index], np.asarray(values, dtype=np.float64))
        dense: ClockedSeries[Any, Any] = ClockedSeries(clocks, on_clocks)
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
        sparse = _sparse(frame, [name for name in watched_series if not per_step(name)])
        for record in records(sparse):
            self.context.note(record)
            for rule in self._readers_of(tuple(record.values)):
                if rule not in closer:
                    findings.extend(rule.observe(record))
        if closer:
            for record in records(ClockedSeries(frame.clocks, watched_series)):
                for rule in self._readers_of(tuple(record.values)):
                    if rule in closer:
                        findings.extend(rule.observe(record))
        return findings

    def replay(self, history: Mapping[str, ArrayColumns]) -> None:
        """Warm the rules on a run's stored points (a detector rebuilt after a restart):
        what they find was found before, and is dropped."""
        self.feed(
            {n: Columns(s.tolist(), t.tolist(), v.tolist()) for n, (s, t, v) in history.items()}
        )

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


def _sparse(frame: ClockedSeries[Any, Any], names: list[str]) -> ClockedSeries[Any, Any]:
    """The series ``names`` of ``frame`` (those not recorded every step), the system samples
    among them thinned (:func:`_thinned`), once for each clock they are on."""
    clocks: list[Clock[Any, Any]] = list(frame.clocks)
    thinned: dict[int, tuple[int, list[int] | None]] = {}  # clock -> (its thinned one, kept)
    series: dict[str, tuple[int, Any]] = {}
    for name in names:
        index, values = frame.series[name]
        if not is_system(name):
            series[name] = (index, values)
            continue
        done = thinned.get(index)
        if done is None:
            steps, times = clocks[index]
            keep = _thinned(times)
            if keep is None:
                done = thinned[index] = (index, None)
            else:
                kept = Clock([steps[i] for i in keep], [times[i] for i in keep])
                done = thinned[index] = (len(clocks), keep)
                clocks.append(kept)
        at, keep = done
        series[name] = (at, values if keep is None else [values[i] for i in keep])
    return ClockedSeries(clocks, series)


def _thinned(times: Sequence[float]) -> list[int] | None:
    """Which of a system series' samples are judged (None: all of them)."""
    if len(times) < 2:
        return None
    bucket = np.floor(np.asarray(times, dtype=np.float64) / SYSTEM_MIN_INTERVAL)
    keep: list[int] = np.flatnonzero(np.diff(bucket, append=np.inf) != 0).tolist()
    return None if len(keep) == len(times) else keep  # each bucket's last


def records(points: Mapping[str, SeqColumns]) -> Iterable[Record]:
    """Regroup a frame's columns into the records the agent logged: the values that share
    a step and a time were recorded together (one step's vitals, or one system sample).
    The rules read them one record at a time, in step order (then time): a step stamped
    after the steps that follow it (one the agent held back to look at closer) is judged in
    its place, as the bulk path judges it, however the frames fall. Each clock's moments
    are listed once."""
    frame = ClockedSeries.of(points)
    moments: dict[int, list[tuple[int, float]]] = {}
    grouped: dict[tuple[int, float], dict[str, float]] = {}
    for name, (index, values) in frame.series.items():
        if not watched(name):
            continue
        keys = moments.get(index)
        if keys is None:
            steps, times = frame.clocks[index]
            keys = moments[index] = list(zip(steps, times, strict=True))
        for key, value in zip(keys, values, strict=True):
            group = grouped.get(key)
            if group is None:
                group = grouped[key] = {}
            group[name] = value
    for (step, time), group in sorted(grouped.items()):
        yield Record(step, time, group)
