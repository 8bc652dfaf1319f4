"""A recorded stream judged again, cut into other frames and replayed at another pace.

Detection must be a function of the stream (its steps and values), not of how the agent cut
it into frames or how fast the machine ran: the zoo (benchmarks/zoo.py) judges every run it
generates a second time this way, and tests/detect/test_determinism.py holds it on recorded
streams. A stream is ``{series: Columns(steps, times, values)}`` in step order, as the
server stores it; a cut is the list of the frames' end steps (exclusive).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trainvitals.detect import AlertBook, Detector, Finding
from trainvitals.protocol import Columns, ListColumns

Stream = Mapping[str, ListColumns]
#: An alert as the determinism check compares it: (rule, subject, severity, step).
Raised = tuple[str, str, str, int]
#: Rules about time itself (how long a silence took, when memory runs out) and about the
#: run's start and end: left out of the comparison. ``slowdown`` reads the step times the
#: stream carries, not the clock, and is compared like the rest.
TIMING_RULES = frozenset({"stall", "oom_forecast", "crash", "env_mismatch"})


def frames(stream: Stream, ends: list[int]) -> Iterator[dict[str, ListColumns]]:
    """The stream in frames: frame ``i`` holds every series' points below step ``ends[i]``
    not in an earlier frame."""
    starts = dict.fromkeys(stream, 0)
    for end in ends:
        frame = {}
        for name, (steps, times, values) in stream.items():
            lo = starts[name]
            hi = int(np.searchsorted(steps, end, side="left"))
            if hi > lo:
                frame[name] = Columns(steps[lo:hi], times[lo:hi], values[lo:hi])
            starts[name] = hi
        yield frame


def last_step(stream: Stream) -> int:
    return max((int(steps[-1]) for steps, _, _ in stream.values() if len(steps)), default=0)


def by_seconds(stream: Stream, seconds: float = 1.0) -> list[int]:
    """Frame ends as the agent cuts a stream: a frame every ``seconds`` of the run (none for
    a stream with nothing in it: a fit killed before its first point)."""
    if not stream:
        return []
    steps = np.concatenate([np.asarray(s, dtype=np.int64) for s, _, _ in stream.values()])
    times = np.concatenate([np.asarray(t, dtype=np.float64) for _, t, _ in stream.values()])
    if not len(steps):
        return []
    order = np.argsort(times, kind="stable")
    steps, times = steps[order], times[order]
    tick = np.floor((times - times[0]) / seconds)
    ends = steps[np.flatnonzero(np.diff(tick) > 0) + 1]
    return sorted({int(e) for e in ends} | {last_step(stream) + 1})


def at_random(stream: Stream, seed: int, longest: int = 97) -> list[int]:
    """Frame ends at random: frames of 1 to ``longest`` steps."""
    rng = np.random.default_rng(seed)
    ends, end, last = [], 0, last_step(stream)
    while end <= last:
        end += int(rng.integers(1, longest + 1))
        ends.append(end)
    return ends


def every(stream: Stream, steps: int) -> list[int]:
    """Frame ends every ``steps`` steps."""
    return list(range(steps, last_step(stream) + steps + 1, steps))


def stretched(stream: Stream, factor: float, t0: float | None = None) -> dict[str, ListColumns]:
    """The same stream at another pace: every time ``factor`` times as far from ``t0`` (by
    default its first; a loop's fits share their process's, so that they stay in order)."""
    if t0 is None:
        t0 = min((t[0] for _, t, _ in stream.values() if len(t)), default=0.0)
    return {
        name: Columns(steps, [t0 + (t - t0) * factor for t in times], values)
        for name, (steps, times, values) in stream.items()
    }


def judged(
    stream: Stream, ends: list[int], env: Mapping[str, Any] | None = None
) -> Iterator[Finding]:
    """The findings of a fresh detector fed the stream in the frames ``ends`` gives that
    raise an alert (fire, fire again or escalate), in order."""
    detector, book = Detector(env=env), AlertBook()
    for frame in frames(stream, ends):
        for finding in detector.feed(frame):
            change = book.apply(finding)
            if change and change[0] != "resolved":
                yield finding


def raised_by(findings: Iterable[Finding]) -> set[Raised]:
    """The alerts the findings raise, rules about time aside."""
    return {(f.rule, f.subject, f.severity, f.step) for f in findings if f.rule not in TIMING_RULES}


def raised(stream: Stream, ends: list[int], env: Mapping[str, Any] | None = None) -> set[Raised]:
    """The alerts raised on the stream fed in the frames ``ends`` gives, rules about time
    aside."""
    return raised_by(judged(stream, ends, env))


def firsts(findings: Iterable[Finding]) -> dict[str, Finding]:
    """Each rule's first warning or critical finding. An alert shows its last firing (a NaN
    that clears and comes back fires its alert again, with the new step and evidence): this
    is its first, with the evidence it had then."""
    out: dict[str, Finding] = {}
    for finding in findings:
        if finding.severity != "info":
            out.setdefault(finding.rule, finding)
    return out


def first_alarms(stream: Stream, env: Mapping[str, Any] | None = None) -> dict[str, Finding]:
    """Each rule's first warning or critical finding on the stream in the agent's frames."""
    return firsts(judged(stream, by_seconds(stream), env))


def differing(first: set[Raised], second: set[Raised]) -> list[str]:
    """The alerts raised one way and not the other, in step order, saying which way."""
    return [
        f"{'only as recorded' if alert in first else 'only recut'}: {alert}"
        for alert in sorted(first ^ second, key=lambda a: (a[3], a[0]))
    ]


def differences(stream: Stream, env: Mapping[str, Any] | None, seed: int) -> list[str]:
    """Every alert that differs between the stream judged in the agent's frames (one a
    second) and judged in random frames at half the pace."""
    if not stream:
        return []
    first = raised(stream, by_seconds(stream), env)
    second = raised(stretched(stream, 2.0), at_random(stream, seed), env)
    return differing(first, second)


def save(path: Path, stream: Stream, env: Mapping[str, Any]) -> None:
    """Write a stream (gzipped JSON; NaN/Inf as JSON's NaN/Infinity)."""
    kept = {
        "env": dict(env),
        "columns": {name: [list(part) for part in c] for name, c in stream.items()},
    }
    path.write_bytes(gzip.compress(json.dumps(kept).encode()))


def load(path: Path) -> tuple[dict[str, ListColumns], dict[str, Any]]:
    """A stream :func:`save` wrote, and its run's environment."""
    kept = json.loads(gzip.decompress(path.read_bytes()))
    stream = {
        name: Columns(
            [int(s) for s in steps],
            [float(t) for t in times],
            [math.nan if v is None else float(v) for v in values],
        )
        for name, (steps, times, values) in kept["columns"].items()
    }
    return stream, kept["env"]
