"""Thresholds of every rule, their defaults, and the rules file that overrides them.

A rules file is TOML. Top-level tables set the defaults for every project; tables under
``[projects.<name>]`` override them for one project::

    [alerts]
    cooldown = 600                 # seconds a resolved alert is reopened rather than repeated

    [grad_explosion]
    factor = 20                    # fire at 20x the baseline instead of 10x

    [oom_forecast]
    horizon = 1800                 # warn 30 minutes ahead

    [projects.gan.loss_divergence]
    enabled = false                # a GAN's losses are supposed to fight

``docs/alerts.md`` explains every setting.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainvitals.exceptions import RulesError


@dataclass(frozen=True)
class Nonfinite:
    enabled: bool = True
    #: Consecutive clean steps after which the alert resolves.
    clear_steps: int = 100
    #: Under a mixed-precision policy, Keras's loss scaling skips a step whose gradients
    #: overflow and lowers the scale: that is normal. Only this many such steps in a row
    #: (the scale collapsing) are an alert.
    mixed_precision_skips: int = 10


@dataclass(frozen=True)
class GradExplosion:
    enabled: bool = True
    #: Steps in the baseline window (log10 of the global norm; median and MAD).
    window: int = 200
    #: Steps seen before the rule judges anything.
    min_history: int = 30
    #: The newest steps are kept out of the baseline, so a climb is measured against where
    #: the norm was before it began.
    lag: int = 10
    #: Warn at this multiple of the baseline, sustained for ``sustain`` steps.
    factor: float = 10.0
    sustain: int = 3
    #: And this far above it in robust standard deviations (on the log scale).
    min_z: float = 6.0
    #: Critical, at once, at this multiple.
    critical_factor: float = 1000.0
    clear_steps: int = 50
    #: Warn (subject ``lr``) when the recorded learning rate rises to this multiple of its
    #: highest ``lr_lag`` or more steps before, once it has not risen for ``lr_settle``
    #: steps in a row (a warm-up is over); 0 turns this off.
    lr_rise: float = 3.0
    lr_lag: int = 100
    lr_settle: int = 50


@dataclass(frozen=True)
class GradVanishing:
    enabled: bool = True
    #: A global gradient norm below this for ``window`` steps means nothing learns.
    min_norm: float = 1e-7
    window: int = 200
    #: The gradient norm of the middle layer of the first third (a layer's kernels together),
    #: over the largest layer's, below this for ``samples`` per-variable samples in a row...
    layer_ratio: float = 1e-4
    samples: int = 20
    #: Or every kernel's gradient exactly zero (every unit dead) for this many samples in a
    #: row, with the same flat loss.
    dead_samples: int = 5
    #: ...while the loss improved by less than this fraction over the last ``window`` steps.
    flat_loss: float = 0.02


@dataclass(frozen=True)
class LossDivergence:
    enabled: bool = True
    #: Steps ignored at the start (warm-up, a learning-rate ramp, the first steps after a
    #: restore).
    warmup_steps: int = 50
    #: Steps whose median is the loss level (a noisy small-batch loss is smoothed this way).
    smooth: int = 25
    #: Steps after the warm-up whose median is "where the loss started".
    early_steps: int = 50
    #: The first this many losses (of the warm-up): their median is where training
    #: started, what it learned is measured from, where higher than after the warm-up.
    first_steps: int = 20
    #: Warn when the level is this multiple of its running minimum...
    min_ratio: float = 1.5
    #: ...(or has given back ``half_back`` of what was learned, where that is lower)...
    half_back: float = 0.5
    #: ...and has given back this share of what was learned since the start...
    lost_fraction: float = 0.35
    #: ...for this many steps. Critical when the level is above where it started.
    sustain: int = 25
    #: Steps whose median is the level the minimum is taken from: longer than ``smooth``, so
    #: a lucky run of easy batches doesn't set a minimum the loss can never hold.
    minimum_window: int = 100
    #: The rise must also be this many standard errors of the level (from the spread of the
    #: last ``minimum_window`` losses): the noise of small batches is not a divergence.
    noise_z: float = 6.0
    #: An info alert for one batch's loss this multiple of the level.
    spike_factor: float = 10.0
    #: A leap: the median of the last ``fast`` losses past the same bars, its rise this many
    #: of its own standard errors (the level's times sqrt(smooth / fast)), for
    #: ``fast_sustain`` steps, fires without waiting for the level.
    fast: int = 5
    fast_z: float = 8.0
    fast_sustain: int = 10
    #: A tail that grows: of the last ``tail_recent`` losses, so many above the
    #: ``tail_quantile`` of the ``minimum_window`` losses that end ``tail_lag`` steps
    #: before them that losses drawn alike would give as many with a chance of at most
    #: ``tail_p``, their mean past the base's by the level's bars and by ``tail_mean_z``
    #: of its standard errors, for ``tail_sustain`` steps. Labels going wrong a few at a
    #: time raise a small batch's mean loss long before its median.
    tail_recent: int = 30
    tail_quantile: float = 0.9
    tail_p: float = 1e-5
    tail_sustain: int = 5
    tail_mean_z: float = 3.0
    tail_lag: int = 40


@dataclass(frozen=True)
class LossAboveChance:
    enabled: bool = True
    #: The first this many finite losses of a model whose loss at chance the agent sent
    #: (a classifier's in its hello, a regression's step by step); their median is where
    #: the loss started...
    steps: int = 20
    #: ...and a warning when that is more than this multiple of the loss at chance (a fresh
    #: model starts within about 1.2 times it).
    factor: float = 2.0
    #: ...or this multiple of a regression's (the loss of predicting 1 and -1: a fresh
    #: model's outputs spread about as its inputs do, so it starts within a few times it).
    regression_factor: float = 10.0


@dataclass(frozen=True)
class OomForecast:
    enabled: bool = True
    #: Warn when the trend reaches the limit within this many seconds...
    horizon: float = 900.0
    #: ...critical within this many.
    critical_eta: float = 120.0
    #: Seconds of samples the trend is fitted on.
    window: float = 180.0
    #: At least this many seconds and samples before any forecast...
    min_span: float = 20.0
    min_points: int = 15
    #: ...except a fill so fast it could end before that: from ``quick_span`` seconds and
    #: ``quick_points`` samples on, a trend that reaches the limit within ``quick_reach``
    #: times the span it was fitted on is forecast at once.
    quick_span: float = 5.0
    quick_points: int = 5
    quick_reach: float = 2.0
    #: Share of sample pairs that must agree the memory grows (see ``theil_sen``).
    min_agreement: float = 0.8
    #: Seconds between forecasts.
    every: float = 5.0


@dataclass(frozen=True)
class MemoryPressure:
    enabled: bool = True
    warning_fraction: float = 0.90
    critical_fraction: float = 0.97
    #: Samples in a row above a threshold before firing (and below it before resolving).
    sustain: int = 3
    #: Swap growing by this many bytes within ``swap_window`` seconds is thrashing ahead.
    swap_growth: float = 256 * 2**20
    swap_window: float = 60.0


@dataclass(frozen=True)
class Stall:
    enabled: bool = True


@dataclass(frozen=True)
class Slowdown:
    enabled: bool = True
    warmup_steps: int = 20
    baseline_window: int = 500
    recent: int = 50
    #: Warn when the recent step time is this multiple of the baseline's, each the mean of
    #: its steps without the longest ``trim`` share of them (a steady share of long steps is
    #: the pace; a rare one is not)...
    factor: float = 2.0
    trim: float = 0.05
    #: ...and at least this many seconds longer, for ``sustain`` steps that take at least
    #: ``sustain_seconds`` between them, where up to ``grace`` steps back at the pace
    #: pause the count rather than end it.
    min_increase: float = 0.001
    sustain: int = 50
    sustain_seconds: float = 2.0
    grace: int = 10


@dataclass(frozen=True)
class Thermal:
    enabled: bool = True
    warning_temp: float = 85.0
    critical_temp: float = 92.0
    #: Samples in a row before firing, and clean ones before resolving.
    sustain: int = 10


@dataclass(frozen=True)
class Hardware:
    enabled: bool = True


@dataclass(frozen=True)
class EnvMismatch:
    enabled: bool = True


@dataclass(frozen=True)
class Crash:
    enabled: bool = True


@dataclass(frozen=True)
class AlertTiming:
    #: A rule and subject that fires again within this many seconds of resolving reopens
    #: the same alert (``count`` goes up) instead of raising a new one.
    cooldown: float = 300.0
    #: Seconds between evidence updates of a firing alert (an ETA that keeps moving).
    update_interval: float = 5.0


@dataclass(frozen=True)
class RuleSet:
    """The settings of every rule for one project."""

    nonfinite: Nonfinite = field(default_factory=Nonfinite)
    grad_explosion: GradExplosion = field(default_factory=GradExplosion)
    grad_vanishing: GradVanishing = field(default_factory=GradVanishing)
    loss_divergence: LossDivergence = field(default_factory=LossDivergence)
    loss_above_chance: LossAboveChance = field(default_factory=LossAboveChance)
    oom_forecast: OomForecast = field(default_factory=OomForecast)
    memory_pressure: MemoryPressure = field(default_factory=MemoryPressure)
    stall: Stall = field(default_factory=Stall)
    slowdown: Slowdown = field(default_factory=Slowdown)
    thermal: Thermal = field(default_factory=Thermal)
    hardware: Hardware = field(default_factory=Hardware)
    env_mismatch: EnvMismatch = field(default_factory=EnvMismatch)
    crash: Crash = field(default_factory=Crash)
    alerts: AlertTiming = field(default_factory=AlertTiming)

    def override(self, table: Mapping[str, Any], where: str = "") -> RuleSet:
        """A copy with the settings in ``table`` (``{rule: {setting: value}}``) changed."""
        changes: dict[str, Any] = {}
        known = {f.name: f for f in fields(self)}
        for rule, settings in table.items():
            if rule not in known:
                raise RulesError(
                    f"{where}[{rule}]: unknown rule; expected one of {', '.join(known)}"
                )
            if not isinstance(settings, Mapping):
                raise RulesError(f"{where}[{rule}]: expected a table of settings")
            changes[rule] = _override(getattr(self, rule), settings, f"{where}[{rule}]")
        return replace(self, **changes)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RulesConfig:
    """Defaults for every project plus per-project overrides."""

    defaults: RuleSet = field(default_factory=RuleSet)
    projects: Mapping[str, RuleSet] = field(default_factory=dict)

    def for_project(self, project: str) -> RuleSet:
        return self.projects.get(project, self.defaults)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RulesConfig:
        data = dict(data)
        projects_table = data.pop("projects", {})
        if not isinstance(projects_table, Mapping):
            raise RulesError("[projects]: expected a table of projects")
        defaults = RuleSet().override(data)
        projects = {
            name: defaults.override(table, f"[projects.{name}]")
            for name, table in projects_table.items()
        }
        return cls(defaults, projects)


def read_toml(path: str | Path, what: str, error: type[Exception] = RulesError) -> dict[str, Any]:
    """The tables of a settings file; ``error`` names the ``what`` (e.g. "rules file") that
    is missing, unreadable or not TOML."""
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise error(f"Can't read the {what} {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"The {what} {str(path)!r} is not valid TOML: {exc}") from None


def load_rules(path: str | Path) -> RulesConfig:
    """Read a rules file; a missing file, bad TOML or an unknown setting is a RulesError."""
    data = read_toml(path, "rules file")
    try:
        return RulesConfig.from_mapping(data)
    except RulesError as exc:
        raise RulesError(f"{path}: {exc}") from None


def _override(settings: Any, table: Mapping[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(settings)}
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise RulesError(
                f"{where} {key!r}: unknown setting; expected one of {', '.join(known)}"
            )
        current = getattr(settings, key)
        if isinstance(current, bool):
            if not isinstance(value, bool):
                raise RulesError(f"{where} {key!r}: expected true or false, got {value!r}")
        elif isinstance(current, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise RulesError(f"{where} {key!r}: expected an integer, got {value!r}")
        elif isinstance(current, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RulesError(f"{where} {key!r}: expected a number, got {value!r}")
            value = float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise RulesError(f"{where} {key!r}: expected a value >= 0, got {value!r}")
        changes[key] = value
    return replace(settings, **changes)
