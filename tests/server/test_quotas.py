"""Per-token caps: each refusal is a close code and a reason naming the setting."""

from __future__ import annotations

import pytest

from trainvitals.exceptions import IngestRejected
from trainvitals.server.live import Subscriber
from trainvitals.server.quotas import Caps, Quotas


def test_connections_runs_series_and_bytes_are_capped_per_token() -> None:
    now = [1000.0]
    quotas = Quotas(Caps(connections=2, runs_per_minute=3, series_per_run=4, bytes_per_day=100),
                    clock=lambda: now[0])  # fmt: skip
    quotas.connect("a")
    quotas.connect("a")
    quotas.connect("b")  # another token has its own
    with pytest.raises(IngestRejected, match="MAX_CONNECTIONS") as refused:
        quotas.connect("a")
    assert refused.value.code == 1013
    quotas.disconnect("a")
    quotas.connect("a")

    for _ in range(3):
        quotas.new_run("a")
    with pytest.raises(IngestRejected, match="MAX_RUNS_PER_MINUTE"):
        quotas.new_run("a")
    now[0] += 61
    quotas.new_run("a")  # a minute later

    quotas.series(4)
    with pytest.raises(IngestRejected, match="MAX_SERIES_PER_RUN") as refused:
        quotas.series(5)
    assert refused.value.code == 1008

    quotas.received("a", 60)
    with pytest.raises(IngestRejected, match="MAX_BYTES_PER_DAY"):
        quotas.received("a", 60)
    now[0] += 86400
    quotas.received("a", 60)  # a new day


def test_a_slow_browser_is_dropped_by_bytes_not_only_by_messages() -> None:
    subscriber = Subscriber(queue_size=1000, max_bytes=1000)
    subscriber.offer("x" * 600)
    assert not subscriber.overflowed.is_set()
    subscriber.offer("y" * 600)  # two messages only, but 1,200 bytes
    assert subscriber.overflowed.is_set() and subscriber.queue.qsize() == 1
    message = subscriber.queue.get_nowait()
    subscriber.taken(message)
    assert subscriber.queued_bytes == 0
