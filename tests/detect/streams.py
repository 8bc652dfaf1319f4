"""Synthetic streams the detection tests feed: a run's columns as an agent frame carries
them, cut into frames, judged whole or frame by frame."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trainvitals.detect import (
    AlertBook,
    Detector,
    Finding,
)
from trainvitals.protocol import Columns, ListColumns

T0 = 1_800_000_000.0
Stream = dict[str, ListColumns]
GiB = 2**30


def stream(steps: range, dt: float, **series: Callable[[int], float]) -> Stream:
    """Columns as an agent frame carries them: every series recorded at every step."""
    return {
        name: Columns(list(steps), [T0 + s * dt for s in steps], [fn(s) for s in steps])
        for name, fn in series.items()
    }


def unfrozen(unfreeze: int, last: int, norm: Callable[[int], float]) -> Stream:
    """Per-variable gradient norms as the agent records them in a fine-tune: a head's two
    variables every ten steps; from ``unfreeze`` on, a backbone's eight convolutions too, the
    first time at that very step (the agent records them when the trained variables change)."""
    sampled = [*range(10, unfreeze, 10), unfreeze, *range(unfreeze - unfreeze % 10 + 10, last, 10)]
    head = ("head/kernel", "head/bias")
    columns: Stream = {}
    for name in (*head, *(f"conv_{i}/kernel" for i in range(8))):
        steps = [s for s in sampled if name in head or s >= unfreeze]
        columns[f"grad/norm/{name}"] = Columns(
            steps, [T0 + s * 0.01 for s in steps], [norm(s) for s in steps]
        )
    return columns


def frames(columns: Stream, steps_per_frame: int) -> list[Stream]:
    """Cut a stream into the frames an agent would send (every series up to a step)."""
    last = max(max(steps) for steps, _, _ in columns.values())
    out = []
    for start in range(0, last + 1, steps_per_frame):
        frame: Stream = {}
        for name, (steps, times, values) in columns.items():
            keep = [i for i, s in enumerate(steps) if start <= s < start + steps_per_frame]
            if keep:
                frame[name] = Columns(
                    [steps[i] for i in keep],
                    [times[i] for i in keep],
                    [values[i] for i in keep],
                )
        out.append(frame)
    return out


def feed(detector: Detector, columns: Stream, steps_per_frame: int | None) -> list[Finding]:
    """Whole (the step-by-step path) or in frames (mostly the bulk path)."""
    if steps_per_frame is None:
        return detector.feed(columns)
    return [f for frame in frames(columns, steps_per_frame) for f in detector.feed(frame)]


#: Each stream is judged whole, in frames of 40 steps (a fast agent: mostly bulk), and of 3.
FRAMINGS = pytest.mark.parametrize("framing", [None, 40, 3])


def fired(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule and f.firing]


def run_through(detector: Detector, columns: Stream, framing: int | None = None):  # type: ignore[no-untyped-def]
    book = AlertBook()
    changes = []
    for finding in feed(detector, columns, framing):
        change = book.apply(finding)
        if change is not None:
            changes.append((change[0], change[1].rule, change[1].severity, finding.step))
    return book, changes


def host(rss: Callable[[int], float], limit: float = 4 * GiB) -> Stream:
    seconds = range(0, 300)
    return {
        "host/rss": Columns(
            [7] * len(seconds), [T0 + t for t in seconds], [rss(t) for t in seconds]
        ),
        "host/limit": Columns(
            [7] * len(seconds), [T0 + t for t in seconds], [limit] * len(seconds)
        ),
    }
