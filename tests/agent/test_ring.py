"""The device ring: rows written by a compiled step, read back in order by one fetch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

from trainvitals.agent.ring import DeviceRing  # noqa: E402
from trainvitals.exceptions import ConfigurationError  # noqa: E402


def writer(ring: DeviceRing) -> Callable[[Any], Any]:
    function: Callable[[Any], Any] = tf.function(
        lambda value: ring.write(tf.fill([ring.width], value))
    )
    return function


def test_rows_come_back_once_in_write_order_with_their_numbers() -> None:
    ring = DeviceRing(width=3, capacity=8)
    write = writer(ring)
    for value in range(1, 6):
        write(tf.constant(float(value)))
    numbers, rows = ring.read()
    assert numbers.tolist() == [1, 2, 3, 4, 5]
    assert rows.tolist() == [[v] * 3 for v in (1.0, 2.0, 3.0, 4.0, 5.0)]
    assert ring.read()[0].tolist() == []  # nothing new
    for value in range(6, 12):  # wraps around the 8 rows
        write(tf.constant(float(value)))
    numbers, rows = ring.read()
    assert numbers.tolist() == list(range(6, 12)) and rows[:, 0].tolist() == list(range(6, 12))
    assert (ring.reads, ring.lost) == (3, 0)


def test_a_reader_that_comes_too_late_counts_the_rows_written_over() -> None:
    ring = DeviceRing(width=1, capacity=4)
    write = writer(ring)
    for value in range(10):
        write(tf.constant(float(value)))
    numbers, _ = ring.read()
    assert numbers.tolist() == [7, 8, 9, 10] and ring.lost == 6


def test_write_numbers_past_float32_precision_stay_exact() -> None:
    ring = DeviceRing(width=1, capacity=4)
    ring._written.assign(2**26 + 3)  # a float32 alone would round this
    ring.read_upto = 2**26 + 3
    writer(ring)(tf.constant(1.0))
    assert ring.read()[0].tolist() == [2**26 + 4]


def test_a_ring_needs_room_for_two_rows() -> None:
    with pytest.raises(ConfigurationError, match="at least 2"):
        DeviceRing(width=1, capacity=1)


def test_keep_returns_every_row_held_since_the_last_take() -> None:
    """A reader judges all the rows it holds, not only the last read's: a rise held for
    three steps may begin in the rows an earlier look kept."""
    ring = DeviceRing(width=1, capacity=8)
    write = writer(ring)
    assert ring.keep().shape == (0, 1)
    for value in (1.0, 2.0):
        write(tf.constant(value))
    assert ring.keep()[:, 0].tolist() == [1.0, 2.0]
    assert ring.keep()[:, 0].tolist() == [1.0, 2.0]  # nothing new: still held
    write(tf.constant(3.0))
    assert ring.keep()[:, 0].tolist() == [1.0, 2.0, 3.0]
    numbers, rows = ring.take()
    assert numbers.tolist() == [1, 2, 3] and rows[:, 0].tolist() == [1.0, 2.0, 3.0]
    write(tf.constant(4.0))
    assert ring.keep()[:, 0].tolist() == [4.0]
