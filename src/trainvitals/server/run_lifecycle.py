"""A run's life as one pure state machine: ``transition(state, event) -> (state, effects)``.

Every change of a run's ``status`` goes through here, whoever notices it: the ingest session
(hello, steps, a stall report, the ``end`` frame, also the one the agent's watchdog sends for
a killed process) and the server's liveness sweep (a run gone silent). No I/O: the callers
carry out the effects, and storage derives its guarded updates from :func:`moves`, so the
database and the session can never disagree about which changes are allowed.

    running ──stall──▶ stalled ──a new step──▶ running
       │                  │
       ├──end─────────────┴──▶ finished (completed) | crashed (anything else)
       └──silent──────────────▶ lost ──hello──▶ running

A stalled run is running again only when a step *beyond* the last one arrives: the agent's
once-a-second host and GPU samples are filed under the latest step and say nothing about
progress. ``finished`` and ``crashed`` are final.

Example:
    >>> state, effects = transition(RunState(RunStatus.RUNNING, last_step=10), Stall())
    >>> state.status, effects
    (<RunStatus.STALLED: 'stalled'>, ())
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from trainvitals.protocol import EndReason, RunStatus

#: Statuses of a run whose process is (as far as anyone knows) alive.
ALIVE = frozenset((RunStatus.RUNNING, RunStatus.STALLED))
#: Statuses nothing moves a run out of.
FINAL = frozenset((RunStatus.FINISHED, RunStatus.CRASHED))


@dataclass(frozen=True)
class RunState:
    """What the lifecycle needs to know of a run."""

    status: RunStatus
    last_step: int | None = None
    end_reason: str | None = None


@dataclass(frozen=True)
class Hello:
    """The run's agent (re)connected."""


@dataclass(frozen=True)
class Progress:
    """Points arrived whose highest step is ``step``."""

    step: int


@dataclass(frozen=True)
class Stall:
    """The agent reports no step for far longer than usual."""


@dataclass(frozen=True)
class End:
    """The run ended (the agent's ``end`` frame, or its watchdog's for a killed process)."""

    reason: str


@dataclass(frozen=True)
class Silent:
    """Nothing heard from the run, not even a heartbeat, for the server's ``lost_after``."""


Event = Hello | Progress | Stall | End | Silent


class Effect(enum.StrEnum):
    """What the caller must do after a transition."""

    #: Expect heartbeats: the liveness sweep watches the run.
    WATCH = "watch"
    #: Stop watching: the run ended or was given up.
    UNWATCH = "unwatch"
    #: A lost run spoke again.
    REVIVED = "revived"
    #: A stalled run stepped again.
    RESUMED = "resumed"
    #: The run ended: judge its ending and settle its alerts.
    ENDED = "ended"


def transition(state: RunState, event: Event) -> tuple[RunState, tuple[Effect, ...]]:
    """The run's next state after ``event``, and what the caller must do about it."""
    status = state.status
    if isinstance(event, Hello):
        if status is RunStatus.LOST:
            return RunState(RunStatus.RUNNING, state.last_step), (Effect.REVIVED, Effect.WATCH)
        return state, ((Effect.WATCH,) if status in ALIVE else ())
    if isinstance(event, Progress):
        advanced = state.last_step is None or event.step > state.last_step
        if not advanced:
            return state, ((Effect.WATCH,) if status in ALIVE else ())
        moved = replace(state, last_step=event.step)
        if status is RunStatus.STALLED:
            return replace(moved, status=RunStatus.RUNNING), (Effect.RESUMED, Effect.WATCH)
        return moved, ((Effect.WATCH,) if status in ALIVE else ())
    if isinstance(event, Stall):
        if status is RunStatus.RUNNING:
            return replace(state, status=RunStatus.STALLED), ()
        return state, ()
    if isinstance(event, End):
        if status in FINAL:
            return state, ()
        ended = RunStatus.FINISHED if event.reason == EndReason.COMPLETED else RunStatus.CRASHED
        return (
            replace(state, status=ended, end_reason=event.reason),
            (Effect.UNWATCH, Effect.ENDED),
        )
    if status in ALIVE:  # Silent
        lost = replace(state, status=RunStatus.LOST, end_reason=EndReason.HEARTBEAT_LOST.value)
        return lost, (Effect.UNWATCH, Effect.ENDED)
    return state, ()


def moves(event: Event) -> dict[RunStatus, RunStatus]:
    """``{from: to}`` for every status ``event`` changes (ignoring step numbers, which the
    caller compares itself): what a guarded database update may change.

    Example:
        >>> {str(k): str(v) for k, v in moves(Silent()).items()}
        {'running': 'lost', 'stalled': 'lost'}
    """
    probe = event
    if isinstance(event, Progress):
        probe = Progress(step=1)  # a step beyond the last (0) one
    out = {}
    for status in RunStatus:
        after, _ = transition(RunState(status, last_step=0), probe)
        if after.status is not status:
            out[status] = after.status
    return out
