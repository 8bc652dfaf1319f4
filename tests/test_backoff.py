"""Reconnect and retry delays: bounded, jittered, and drawn from a generator of their own."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from trainvitals.backoff import backoff_delays


def test_delays_stay_under_a_ceiling_that_doubles_up_to_the_maximum() -> None:
    delays = list(itertools.islice(backoff_delays(initial=0.5, maximum=3.0), 200))
    ceilings = [min(0.5 * 2**i, 3.0) for i in range(200)]
    assert all(0.0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays[10:]) > 1.5  # the ceiling did grow
    assert len(set(delays)) == len(delays)  # jittered


def test_the_shared_random_generator_is_left_alone() -> None:
    random.seed(3)
    state = random.getstate()
    list(itertools.islice(backoff_delays(), 50))
    assert random.getstate() == state


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_forked_children_draw_other_delays_than_their_parent() -> None:
    """Data-loader workers, or the server's processes, forked after the import: each must back
    off at its own times, or they reconnect in step."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and leaves
        try:
            os.write(write, repr(list(itertools.islice(backoff_delays(), 5))).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = pipe.read()
    os.waitpid(child, 0)
    ours = repr(list(itertools.islice(backoff_delays(), 5)))
    assert theirs and theirs != ours
