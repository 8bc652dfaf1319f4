"""The run lifecycle as a pure state machine: every status, every event, no I/O."""

from __future__ import annotations

import pytest

from trainvitals.protocol import EndReason, RunStatus
from trainvitals.server.run_lifecycle import (
    ALIVE,
    FINAL,
    Effect,
    End,
    Event,
    Hello,
    Progress,
    RunState,
    Silent,
    Stall,
    moves,
    transition,
)

R, S, F, C, L = (
    RunStatus.RUNNING,
    RunStatus.STALLED,
    RunStatus.FINISHED,
    RunStatus.CRASHED,
    RunStatus.LOST,
)


@pytest.mark.parametrize(
    ("before", "event", "after", "effects"),
    [
        (R, Hello(), R, (Effect.WATCH,)),
        (S, Hello(), S, (Effect.WATCH,)),
        (L, Hello(), R, (Effect.REVIVED, Effect.WATCH)),
        (F, Hello(), F, ()),
        (C, Hello(), C, ()),
        (R, Progress(11), R, (Effect.WATCH,)),
        (S, Progress(11), R, (Effect.RESUMED, Effect.WATCH)),
        (F, Progress(11), F, ()),
        (R, Stall(), S, ()),
        (S, Stall(), S, ()),
        (L, Stall(), L, ()),
        (F, Stall(), F, ()),
        (R, End(EndReason.COMPLETED), F, (Effect.UNWATCH, Effect.ENDED)),
        (S, End(EndReason.COMPLETED), F, (Effect.UNWATCH, Effect.ENDED)),
        (R, End(EndReason.EXCEPTION), C, (Effect.UNWATCH, Effect.ENDED)),
        (S, End("signal:SIGTERM"), C, (Effect.UNWATCH, Effect.ENDED)),
        (L, End(EndReason.SIGKILL), C, (Effect.UNWATCH, Effect.ENDED)),  # the watchdog's
        (F, End(EndReason.EXCEPTION), F, ()),
        (C, End(EndReason.COMPLETED), C, ()),
        (R, Silent(), L, (Effect.UNWATCH, Effect.ENDED)),
        (S, Silent(), L, (Effect.UNWATCH, Effect.ENDED)),
        (L, Silent(), L, ()),
        (F, Silent(), F, ()),
    ],
)
def test_transitions(
    before: RunStatus, event: Event, after: RunStatus, effects: tuple[Effect, ...]
) -> None:
    state, done = transition(RunState(before, last_step=10), event)
    assert (state.status, done) == (after, effects)


def test_a_stalled_run_stays_stalled_until_a_new_step() -> None:
    """The once-a-second samples are filed under the latest step: no progress."""
    stalled = RunState(S, last_step=10)
    for step in (10, 9, 0):
        assert transition(stalled, Progress(step)) == (stalled, (Effect.WATCH,))
    resumed, effects = transition(stalled, Progress(11))
    assert (resumed.status, resumed.last_step, effects[0]) == (R, 11, Effect.RESUMED)


def test_progress_raises_the_last_step_only_forward() -> None:
    state, _ = transition(RunState(R, last_step=None), Progress(5))
    assert state.last_step == 5
    assert transition(state, Progress(3))[0].last_step == 5


def test_endings_carry_their_reason() -> None:
    lost, _ = transition(RunState(R), Silent())
    assert lost.end_reason == EndReason.HEARTBEAT_LOST
    revived, _ = transition(lost, Hello())
    assert (revived.status, revived.end_reason) == (R, None)
    crashed, _ = transition(RunState(R), End("signal:SIGTERM"))
    assert (crashed.status, crashed.end_reason) == (C, "signal:SIGTERM")


def test_final_statuses_never_move() -> None:
    events: list[Event] = [Hello(), Progress(99), Stall(), End(EndReason.COMPLETED), Silent()]
    for status in FINAL:
        for event in events:
            assert transition(RunState(status, last_step=1), event)[0].status is status


def test_moves_are_the_status_changes_storage_may_make() -> None:
    assert moves(Silent()) == {R: L, S: L}
    assert moves(Hello()) == {L: R}
    assert moves(Stall()) == {R: S}
    assert moves(Progress(1)) == {S: R}
    assert moves(End(EndReason.COMPLETED)) == {R: F, S: F, L: F}
    assert moves(End(EndReason.EXCEPTION)) == {R: C, S: C, L: C}
    assert set(moves(Silent())) == ALIVE
