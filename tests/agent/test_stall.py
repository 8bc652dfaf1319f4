"""The hang detector's threshold and reporting, on an injected clock."""

from __future__ import annotations

import threading

from trainvitals.agent.stall import StallDetector, thread_stacks


def test_nothing_is_judged_before_the_second_step() -> None:
    detector = StallDetector(factor=10, floor=1)
    assert detector.check(now=1000.0) is None
    detector.step(now=0.0)  # the first step: tracing and compilation may take any time
    assert detector.check(now=1000.0) is None


def test_threshold_is_factor_times_p95_or_the_floor() -> None:
    detector = StallDetector(factor=10, floor=5)
    now = 0.0
    for _ in range(100):
        now += 1.0  # one step a second
        detector.step(now)
    assert detector.threshold() == 10.0
    assert detector.check(now + 9.9) is None
    assert detector.check(now + 10.5) == (10.5, 10.0)
    assert detector.check(now + 11.0) is None  # reported once per stall
    detector.step(now + 12.0)  # steps resume
    assert detector.check(now + 13.0) is None

    fast = StallDetector(factor=10, floor=5)
    for i in range(1, 50):
        fast.step(i * 0.01)
    assert fast.threshold() == 5  # 10 x 10 ms is below the floor


def test_thread_stacks_name_every_thread() -> None:
    gate = threading.Event()
    waiter = threading.Thread(target=gate.wait, name="blocked-on-gate")
    waiter.start()
    try:
        stacks = thread_stacks()
    finally:
        gate.set()
        waiter.join()
    assert "Thread 'blocked-on-gate'" in stacks and "in wait" in stacks
    assert "Thread 'MainThread'" in stacks
