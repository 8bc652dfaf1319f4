"""Rules on memory: the time left before a limit (forecast) and pressure now.

Memory belongs to the process, not to one ``fit``: a loop of fits (folds, trials, curriculum
stages) makes a run per fit, and what each keeps piles up between them, flat within each. So
the two rules can be shared by the runs of one process (:class:`ProcessMemory`): their tracks
go on from run to run, and the forecast also fits a trend to each fit's floor (the least the
memory fell to during it) to see growth between fits.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from trainvitals.detect import settings as s
from trainvitals.detect.alert_book import AlertBook
from trainvitals.detect.base import Context, Rule, finite
from trainvitals.detect.evidence import OomEvidence
from trainvitals.detect.stats import Trend, theil_sen
from trainvitals.detect.text import duration, size
from trainvitals.detect.types import Finding, Record, Severity
from trainvitals.series import (
    GPU_PREFIX,
    HOST_RSS,
    HOST_SWAP_USED,
    HOST_WORKING_SET,
    memory_in_use,
)

#: The rules whose alerts belong to the process when its runs share them.
PROCESS_RULES = ("oom_forecast", "memory_pressure")
#: Fits whose floors the trend between fits is drawn through: the last this many.
FITS_KEPT = 30
#: At least this many fits before a trend between them, the first fit of the process not
#: counted: its floor is its first reading, taken before it built its graph, its optimizer's
#: slots and its data pipeline, which the second fit finds in place (start-up, not a leak).
MIN_FITS = 4

HOST_LEAK_HINT = (
    "Something keeps a reference that grows every step: a list of tensors, losses or "
    "predictions kept across steps, history appended in a callback, `model.predict` or a new "
    "`tf.function` traced inside the loop, a cache without a bound. `tracemalloc` snapshots "
    "a minute apart show what grows. A smaller batch or a higher memory limit only buys time; "
    "save a checkpoint before the kernel's OOM killer ends the run."
)
LOOP_LEAK_HINT = (
    "Memory grows from one fit to the next and stays: the loop keeps something of every "
    "iteration. Call `keras.backend.clear_session()` between fits; drop the references to "
    "old models, histories, predictions and arrays (`del model`), then `gc.collect()`; feed "
    "data through `tf.data` rather than Python generators that hold tensors; build "
    "augmented copies inside the fold, not in a list kept across folds. Running each fit in "
    "a child process frees everything it held when it exits."
)
GPU_LEAK_HINT = (
    "TensorFlow's allocator grows every step: look for tensors kept across steps, a "
    "`tf.function` retraced with new shapes, or growing caches. To fit what you have: a "
    "smaller batch or gradient accumulation, mixed precision "
    "(`keras.mixed_precision.set_global_policy('mixed_float16')`), and "
    "`tf.config.experimental.set_memory_growth(gpu, True)` if other processes share the card."
)
HOST_PRESSURE_HINT = (
    "The process is close to its memory limit: the kernel's OOM killer ends it without a "
    "traceback. Lower the batch size or the tf.data buffers (`shuffle`, `prefetch`, `cache`), "
    "free what you keep between steps, or raise the limit."
)
GPU_PRESSURE_HINT = (
    "The GPU is nearly full: the next larger allocation raises ResourceExhaustedError. "
    "Use a smaller batch or gradient accumulation, mixed precision, or rematerialisation; "
    "free tensors kept between steps."
)
SWAP_HINT = (
    "The host is swapping: steps will slow down by orders of magnitude and the run may "
    "hang. Reduce host memory use (smaller tf.data buffers, fewer workers) or move the job "
    "to a host with more memory."
)


def _subject(name: str, context: Context) -> tuple[str, str, str] | None:
    """``(subject, used series, limit series)`` for a memory series, or None."""
    found = memory_in_use(name, context.latest)
    return None if found is None else (found[0], name, found[1])


@dataclass
class _Track:
    series: str
    times: deque[float] = field(default_factory=deque)
    values: deque[float] = field(default_factory=deque)
    last_forecast: float = float("-inf")
    calm: int = 0
    #: Each fit's (first reading's time, least reading): the floors growth between fits lifts
    #: (the first fit's left out).
    fits: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=FITS_KEPT))
    new_fit: bool = True
    fits_seen: int = 0


class OomForecastRule(Rule):
    """A Theil-Sen trend of memory use meeting its limit within the horizon: of the readings
    of the last ``window`` seconds, and of the floors of the process's fits."""

    id = "oom_forecast"
    watches = (HOST_RSS, HOST_WORKING_SET, GPU_PREFIX)

    def __init__(self, context: Context, settings: s.OomForecast) -> None:
        super().__init__(context)
        self.settings = settings
        self._tracks: dict[str, _Track] = {}

    def new_fit(self) -> None:
        """The process began another run: its readings are the floor of a new fit."""
        for track in self._tracks.values():
            track.new_fit = True

    def observe(self, record: Record) -> list[Finding]:
        out = []
        for name, value in record.values.items():
            found = _subject(name, self.context) if finite(value) else None
            if found is None:
                continue
            subject, used, limit_name = found
            limit = self.context.latest.get(limit_name)
            if limit is None or limit <= 0:
                continue
            track = self._tracks.get(subject)
            if track is None or track.series != used:
                track = self._tracks[subject] = _Track(used)
            track.times.append(record.time)
            track.values.append(value)
            if track.new_fit:
                track.fits_seen += 1
                track.new_fit = False
                if track.fits_seen > 1:
                    track.fits.append((record.time, value))
            elif track.fits and value < track.fits[-1][1]:
                track.fits[-1] = (track.fits[-1][0], value)
            while track.times and track.times[0] < record.time - self.settings.window:
                track.times.popleft()
                track.values.popleft()
            finding = self._forecast(subject, track, record, value, limit)
            if finding is not None:
                out.append(finding)
        return out

    def _forecast(
        self, subject: str, track: _Track, record: Record, current: float, limit: float
    ) -> Finding | None:
        cfg = self.settings
        if record.time - track.last_forecast < cfg.every:
            return None
        trends: list[tuple[bool, Trend]] = []  # (between fits, trend)
        span = track.times[-1] - track.times[0]
        if len(track.times) >= cfg.min_points and span >= cfg.min_span:
            trends.append((False, theil_sen(list(track.times), list(track.values))))
        elif len(track.times) >= cfg.quick_points and span >= cfg.quick_span:
            # A leak that fills the limit in seconds would be gone before min_span: its trend
            # counts only when it reaches the limit within a few times the span it stands on.
            quick = theil_sen(list(track.times), list(track.values))
            reach = (
                (limit - max(quick.at(record.time), current)) / quick.slope
                if quick.slope > 0
                else float("inf")
            )
            if reach <= cfg.quick_reach * span:
                trends.append((False, quick))
        if len(track.fits) >= MIN_FITS:
            starts, lows = zip(*track.fits, strict=True)
            trends.append((True, theil_sen(starts, lows)))
        if not trends:
            return None
        track.last_forecast = record.time
        now = record.time
        between, trend, eta = False, trends[0][1], float("inf")
        for kind, candidate in trends:
            if candidate.slope > 0 and candidate.agreement >= cfg.min_agreement:
                left = max(0.0, (limit - max(candidate.at(now), current)) / candidate.slope)
                if left < eta:
                    between, trend, eta = kind, candidate, left
        fitted = min(trend.at(now), limit)
        if eta > cfg.horizon:
            track.calm += 1
            if subject in self.firing and (track.calm >= 3 or trend.slope <= 0):
                return self.resolve(subject, record)
            return None
        track.calm = 0
        severity: Severity = "critical" if eta <= cfg.critical_eta else "warning"
        rate = self.context.steps_per_second
        evidence: OomEvidence = {
            "series": track.series,
            "current": current,
            "limit": limit,
            "fraction": current / limit,
            "slope": trend.slope,
            "eta_s": eta,
            "agreement": trend.agreement,
            "window_s": track.times[-1] - track.times[0],
            "trend": "between_fits" if between else "readings",
            "forecast": {
                "series": track.series,
                "time": [now, now + eta],
                "step": [record.step, record.step + round(eta * rate)],
                "value": [fitted, limit],
            },
        }
        growth = f"growing {size(trend.slope * 60)}/min"
        if between:
            floors = [floor for _, floor in track.fits]
            per_fit = (floors[-1] - floors[0]) / (len(floors) - 1)
            evidence["fits"] = len(floors)
            evidence["growth_per_fit"] = per_fit
            growth = f"{size(per_fit)} more kept after each of the last {len(floors)} fits"
        if subject == "host":
            what = "working set" if track.series == HOST_WORKING_SET else "RSS"
            message = (
                f"Host memory reaches its limit in {duration(eta)}: {what} "
                f"{size(min(current, limit))} of {size(limit)}, {growth}"
            )
            hint = LOOP_LEAK_HINT if between else HOST_LEAK_HINT
        else:
            what = "TensorFlow's allocator" if track.series.endswith("tf_current") else "memory"
            message = (
                f"{subject.upper()} memory fills in {duration(eta)}: {what} at "
                f"{size(min(current, limit))} of {size(limit)}, {growth}"
            )
            hint = LOOP_LEAK_HINT if between else GPU_LEAK_HINT
        return self.fire(subject, record, severity, message, hint, evidence)


class MemoryPressureRule(Rule):
    """Memory above a high fraction of its limit now; swap filling up."""

    id = "memory_pressure"
    watches = (HOST_RSS, HOST_WORKING_SET, HOST_SWAP_USED, GPU_PREFIX)

    def __init__(self, context: Context, settings: s.MemoryPressure) -> None:
        super().__init__(context)
        self.settings = settings
        self._counts: dict[str, int] = {}
        self._swap: deque[tuple[float, float]] = deque()

    def observe(self, record: Record) -> list[Finding]:
        out = []
        for name, value in record.values.items():
            if not finite(value):
                continue
            if name == HOST_SWAP_USED:
                finding = self._swap_growth(record, value)
                if finding is not None:
                    out.append(finding)
                continue
            found = _subject(name, self.context)
            if found is None or found[1].endswith("mem_used"):
                continue  # NVML's "used" is what TensorFlow reserved, not what it uses
            subject, _, limit_name = found
            limit = self.context.latest.get(limit_name)
            if limit is None or limit <= 0:
                continue
            finding = self._level(subject, record, value, limit)
            if finding is not None:
                out.append(finding)
        return out

    def _level(self, subject: str, record: Record, used: float, limit: float) -> Finding | None:
        cfg = self.settings
        fraction = used / limit
        severity: Severity = "critical" if fraction >= cfg.critical_fraction else "warning"
        high = fraction >= cfg.warning_fraction
        low = fraction < cfg.warning_fraction - 0.05
        count = self._counts.get(subject, 0)
        count = (max(count, 0) + 1) if high else (min(count, 0) - 1) if low else 0
        self._counts[subject] = count
        current = self.firing.get(subject)
        if high and count >= cfg.sustain and current != severity:
            where = "Host memory" if subject == "host" else f"{subject.upper()} memory"
            # A limit the kernel enforces is never passed: a reading above it is a page batch
            # in flight, or (an RSS) shared pages the cgroup does not charge.
            shown = min(used, limit)
            message = (
                f"{where} at {min(fraction, 1.0):.0%} of its limit: {size(shown)} of {size(limit)}"
            )
            hint = HOST_PRESSURE_HINT if subject == "host" else GPU_PRESSURE_HINT
            evidence = {"used": used, "limit": limit, "fraction": fraction}
            return self.fire(subject, record, severity, message, hint, evidence)
        if current is not None and -count >= cfg.sustain:
            return self.resolve(subject, record)
        return None

    def _swap_growth(self, record: Record, swap: float) -> Finding | None:
        cfg = self.settings
        self._swap.append((record.time, swap))
        while self._swap and self._swap[0][0] < record.time - cfg.swap_window:
            self._swap.popleft()
        growth = swap - min(v for _, v in self._swap)
        if swap > 0 and growth >= cfg.swap_growth:
            if "swap" not in self.firing:
                message = (
                    f"Swap grew by {size(growth)} in {self._swap[-1][0] - self._swap[0][0]:.0f}"
                    f" s (now {size(swap)})"
                )
                evidence = {"swap_used": swap, "growth": growth, "window_s": cfg.swap_window}
                return self.fire("swap", record, "warning", message, SWAP_HINT, evidence)
        elif "swap" in self.firing and growth < cfg.swap_growth / 4:
            return self.resolve("swap", record)
        return None


class ProcessMemory:
    """The memory rules of one training process and their alerts, carried from run to run.

    Each run the process makes judges its memory readings with the same two rules (tracks,
    hysteresis and what fires go on), and their findings go to this book, not the run's: one
    alert per process and memory, naming the runs it spans.

    Example:
        ```python
        memory = ProcessMemory(RuleSet())
        detector = Detector(settings, env, memory=memory.rules)
        memory.join("run-2", "fold-2", detector.context)
        for finding in detector.feed(frame):
            book = memory.book if finding.rule in PROCESS_RULES else run_book
        ```
    """

    def __init__(self, settings: s.RuleSet) -> None:
        context = Context()
        self.forecast = OomForecastRule(context, settings.oom_forecast)
        pressure = MemoryPressureRule(context, settings.memory_pressure)
        self.rules: list[Rule] = [
            rule
            for rule, enabled in (
                (self.forecast, settings.oom_forecast.enabled),
                (pressure, settings.memory_pressure.enabled),
            )
            if enabled
        ]
        self.book = AlertBook(settings.alerts)
        #: The process's runs, ``(run id, name)`` in the order they began.
        self.runs: list[tuple[str, str]] = []
        #: Alert id -> the index in :attr:`runs` of the run it fired in.
        self._began: dict[str, int] = {}

    def join(self, run_id: str, name: str, context: Context) -> None:
        """The process began (or a server took up) a run: its readings go on the tracks."""
        if any(run_id == known for known, _ in self.runs):
            return
        for rule in self.rules:
            rule.context = context
        self.forecast.new_fit()
        self.runs.append((run_id, name))

    def spans(self, alert_id: str) -> list[dict[str, str]]:
        """The runs an alert of this book spans: from the one it fired in to the newest."""
        began = self._began.setdefault(alert_id, max(len(self.runs) - 1, 0))
        return [{"id": run_id, "name": name} for run_id, name in self.runs[began:]]
