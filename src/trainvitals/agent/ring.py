"""The device-side ring: each step's vitals stay where they were computed until one fetch
brings many steps to the host at once.

The train step (or ``Monitor``'s compiled log call) writes its packed vector, and its number,
into one row of a ``tf.Variable`` of ``capacity`` rows; nothing is fetched per step, so the
agent adds no host-device synchronisation and no Python to a step. The host reads the whole
variable now and then (:meth:`DeviceRing.read`: every flush interval on the sender thread,
and on the training thread when half the ring has been written since the last read, so that
no row is overwritten unread) and keeps the rows it has not seen.

Rows carry their write number (1, 2, ...) in two float32 columns (``number // 2**20`` and
``number % 2**20``, both exact), so that a row and its number are one variable and one read:
a read can never pair one step's vector with another step's number. A ``ResourceVariable``
read is a snapshot, even while the training thread writes.

Imports TensorFlow: load it lazily.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt
import tensorflow as tf

from trainvitals.agent.config import DEFAULT_RING_CAPACITY
from trainvitals.exceptions import ConfigurationError

#: How a write number is split across the two leading float32 columns (each part < 2**24).
_SPLIT = 2**20
#: The columns ahead of the vector.
NUMBER_COLUMNS = 2


class DeviceRing:
    """A ring of ``capacity`` rows of ``width`` float32 values, kept on the device.

    Args:
        width: values per row (the packed vector, and anything else the step reports).
        capacity: rows kept; a reader must come at least every ``capacity`` writes.

    Example:
        ```python
        ring = DeviceRing(width=12)
        ...                                  # inside the compiled step:
        ring.write(vector)                   # one scatter, no transfer
        ...                                  # on any thread, now and then:
        numbers, rows = ring.read()          # the rows written since the last read
        ```
    """

    def __init__(self, width: int, capacity: int = DEFAULT_RING_CAPACITY) -> None:
        if capacity < 2:
            raise ConfigurationError(f"ring capacity: expected at least 2 rows, got {capacity}")
        self.width = int(width)
        self.capacity = int(capacity)
        with tf.init_scope():  # made eagerly, even when first asked for while a step is traced
            self._rows = tf.Variable(
                tf.fill([self.capacity, NUMBER_COLUMNS + self.width], -1.0),
                trainable=False,
                name="trainvitals_ring",
            )
            self._written = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, name="trainvitals_ring_written"
            )
        self._lock = threading.Lock()
        # Rows read by keep() and not yet taken, as one block: (write numbers, values).
        self._kept_rows = self._empty()
        #: The highest write number read so far.
        self.read_upto = 0
        #: How many host reads there were (the tests count them per step).
        self.reads = 0
        #: Rows overwritten before any read saw them (0 unless a reader came too late).
        self.lost = 0

    def write(self, vector: Any) -> Any:
        """Write ``vector`` (``width`` float32 values) into the next row; returns the write
        number as an int64 tensor. Graph operations: call it inside the compiled step."""
        # Few operations, each a node the executor schedules in every step: the number read
        # once (each use of assign_add's result would read the variable again), a scalar index
        # (no reshapes), the row made by one concatenation.
        # After the vector, which needs the step's batch: a step that finds no batch (the end
        # of a dataset of unknown length, where Keras calls the step once more) writes no row
        # and counts none. Without the dependency the executor could run the count first.
        with tf.control_dependencies([vector]):
            number = tf.convert_to_tensor(self._written.assign_add(1))
        parts = tf.cast(
            tf.stack([tf.math.floordiv(number, _SPLIT), tf.math.floormod(number, _SPLIT)]),
            tf.float32,
        )
        row = tf.concat([parts, tf.cast(tf.reshape(vector, [-1]), tf.float32)], 0)
        tf.raw_ops.ResourceScatterUpdate(
            resource=self._rows.handle,
            indices=tf.math.floormod(number, self.capacity),
            updates=row,
        )
        return number

    def rewind(self) -> None:
        """Empty the ring and count from 1 again: a train step traced for an earlier fit writes
        the next fit's steps into the same variables. Between fits only: no step running, no
        reader of the earlier rows left."""
        with self._lock:
            self._rows.assign(tf.fill([self.capacity, NUMBER_COLUMNS + self.width], -1.0))
            self._written.assign(0)
            self._kept_rows = self._empty()
            self.read_upto = self.reads = self.lost = 0

    def written(self) -> int:
        """How many rows the step has written so far (a read of one counter)."""
        return int(self._written.numpy())

    def read(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The rows written since the last read, oldest first: their write numbers and their
        values (float64). One fetch of the whole ring; safe from any thread.

        The fetch is TensorFlow's bare ``ReadVariableOp``, not ``Variable.numpy()``: the
        variable's Python layers (gradient tape bookkeeping, device scopes) cost three times
        the op itself, and inside a fit, with the caches full of the training step, a read
        comes to about 0.4 ms instead of 0.6. Only the fresh rows become float64."""
        with self._lock:
            return self._fresh()

    def keep(self, upto: int | None = None) -> npt.NDArray[np.float64]:
        """Read as :meth:`read` does, and keep the rows for :meth:`take`; returns the values of
        every row kept since the last take, oldest first, not only this read's (a reader looks
        at rows often, for a NaN or a rising norm, and turns them into points seldom; a rise
        held for several steps may begin in the rows of an earlier look). The array returned
        is the one held: read it, do not write to it. Rows numbered after ``upto`` are left
        unread (a later fit's, run by a train step the tap still wraps)."""
        with self._lock:
            numbers, values = self._fresh(upto)
            kept_numbers, kept = self._kept_rows
            if len(numbers):
                if len(kept_numbers):
                    numbers = np.concatenate([kept_numbers, numbers])
                    values = np.concatenate([kept, values])
                self._kept_rows = numbers, values
            return self._kept_rows[1]

    def take(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The rows kept since the last take, oldest first, as :meth:`read` returns them."""
        with self._lock:
            kept, self._kept_rows = self._kept_rows, self._empty()
        return kept

    def _empty(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        return np.empty(0, np.int64), np.empty((0, self.width), np.float64)

    def _fresh(
        self, upto: int | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        fetched = tf.raw_ops.ReadVariableOp(resource=self._rows.handle, dtype=tf.float32)
        rows = fetched.numpy()
        self.reads += 1
        numbers = rows[:, 0].astype(np.int64) * _SPLIT + rows[:, 1].astype(np.int64)
        fresh = np.flatnonzero(numbers > self.read_upto)
        if upto is not None:
            fresh = fresh[numbers[fresh] <= upto]
        if len(fresh) == 0:
            return self._empty()
        order = fresh[np.argsort(numbers[fresh], kind="stable")]
        numbers = numbers[order]
        # A gap before the oldest row still here: rows written over unread.
        self.lost += max(0, int(numbers[0]) - self.read_upto - 1)
        self.read_upto = int(numbers[-1])
        return numbers, rows[order, NUMBER_COLUMNS:].astype(np.float64)
