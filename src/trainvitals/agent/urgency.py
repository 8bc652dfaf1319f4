"""Which recorded points must leave at once rather than at the next send.

Points wait up to ``flush_interval`` (1 s) before they are sent: each frame costs the server
about 2 ms of CPU whatever it holds, and the sender its share, so fewer, fuller frames keep
the agent's cost down on a small machine. Some points cannot wait that long, because an alert
on them is worth most in the second after they happen:

- a NaN/Inf (a count above zero, or a loss or gradient norm that is not finite): the
  ``nonfinite`` alert, critical in the very step;
- a global gradient norm at least :data:`RISE` times the median of the norms before it, for
  :data:`SUSTAIN` steps in a row: the rise that the server's ``grad_explosion`` warning is
  made of, which leads the NaN it foretells by well under a second when the norm climbs fast.
  The server warns at ten times a robust baseline, sustained for three steps; three times the
  recent median for three steps comes first on any fast climb. One step alone does not count:
  with small batches a single norm three times the median is ordinary noise, and judged by
  single steps a noisy run would send at every look (measured: 16 of 21 looks of a small
  regression at batch 16). A slow climb does not trip it, and then the warning comes at most
  one send interval later, seconds before a NaN that is itself seconds or more away;
- memory (the host's, or a GPU's) that, growing as fast as it did since the reading before,
  would reach its limit within :data:`MEMORY_ETA` seconds: the OOM kill that follows takes
  every point not yet sent with it, and the readings of the last second before it are the
  run's evidence. Memory that stands still, however high, waits its turn (the
  ``memory_pressure`` alert is judged on readings a second apart just as well).

Such points, and everything recorded before them, are sent at the next look at the ring
(``read_interval``, 0.2 s). Events (a stall, an autopsy) go at once anyway
(:meth:`Sender.send_event <trainvitals.agent.transport.Sender.send_event>`).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import islice

import numpy as np

from trainvitals.protocol import SeqColumns
from trainvitals.series import GRAD_GLOBAL_NORM, LOSS, NONFINITE_PREFIX, memory_in_use

#: A global gradient norm this many times the median of the ones before it is sent at once.
RISE = 3.0
#: ... for this many steps in a row (the server's ``grad_explosion`` sustain).
SUSTAIN = 3
#: Norms the median is taken over, and how many are needed before a rise counts.
WINDOW = 200
MIN_HISTORY = 30
#: Memory that would reach its limit within this many seconds, at its latest rate, is sent
#: at once (ten sends' worth: a leak that fast ends the run before many more sends).
MEMORY_ETA = 10.0


class Urgency:
    """Says whether newly recorded values must be sent now; keeps the recent gradient norms.

    A few NumPy operations per call, on blocks of steps from the device ring; safe to call
    from the training thread and the sender thread at once.
    """

    def __init__(self) -> None:
        self._norms: deque[float] = deque(maxlen=WINDOW)
        #: The norm from which one is urgent: RISE times the history's median, once the
        #: history holds MIN_HISTORY norms.
        self._limit = math.inf
        self._lock = threading.Lock()
        #: Each memory's previous reading: ``{subject: (unix time, bytes used)}``.
        self._memory: dict[str, tuple[float, float]] = {}

    def columns_are_urgent(self, columns: Mapping[str, SeqColumns]) -> bool:
        """Whether these columns (``{name: (steps, times, values)}``) hold an urgent point."""
        return self._judge({name: column[2] for name, column in columns.items()})

    def values_are_urgent(self, values: Mapping[str, float]) -> bool:
        """Whether one step's values (``{name: value}``) hold an urgent point."""
        return self._judge({name: (value,) for name, value in values.items()})

    def would_be_urgent(self, series: Mapping[str, Iterable[float]]) -> bool:
        """Whether ``{name: values}`` hold an urgent point, without adding their gradient
        norms to the history (for values looked at before they are recorded)."""
        return self._judge(series, record=False)

    def memory_is_urgent(self, readings: Mapping[str, float], now: float) -> bool:
        """Whether one sample of the system readings (``{name: value}``, taken at ``now``)
        shows a memory about to reach its limit (see :data:`MEMORY_ETA`)."""
        urgent = False
        with self._lock:
            for subject, used, limit in _memories(readings):
                before = self._memory.get(subject)
                self._memory[subject] = (now, used)
                if used >= limit:
                    urgent = True
                elif before is not None and now > before[0] and used > before[1]:
                    rate = (used - before[1]) / (now - before[0])
                    urgent |= (limit - used) / rate < MEMORY_ETA
        return urgent

    def _judge(self, series: Mapping[str, Iterable[float]], record: bool = True) -> bool:
        urgent = False  # every series looked at: the norms' history must see each block
        for name, values in series.items():
            if name.startswith(NONFINITE_PREFIX):
                urgent |= _any_count(values)
            elif name == LOSS:
                urgent |= not _all_finite(values)
            elif name == GRAD_GLOBAL_NORM:
                urgent |= self._norms_urgent(values, record)
        return urgent

    def _norms_urgent(self, values: Iterable[float], record: bool) -> bool:
        norms = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(norms)):
            return True
        with self._lock:
            # the last recorded norms lead in: a streak may begin before this block
            tail = list(islice(reversed(self._norms), SUSTAIN - 1))[::-1]
            high = np.concatenate([np.asarray(tail), norms]) >= self._limit
            urgent = len(high) >= SUSTAIN and bool(
                np.convolve(high, np.ones(SUSTAIN), "valid").max() >= SUSTAIN
            )
            if record:
                self._norms.extend(norms[-WINDOW:].tolist())
                if len(self._norms) >= MIN_HISTORY:
                    # worked out when the history changes, not at every look at it
                    self._limit = RISE * float(np.median(np.asarray(self._norms)))
        return urgent


def _memories(readings: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """``(subject, used, limit)`` of each memory in a sample, as the server's memory rules
    pair them (:func:`~trainvitals.series.memory_in_use`)."""
    found = []
    for name, used in readings.items():
        pair = memory_in_use(name, readings)
        if pair is not None and np.isfinite(used):
            limit = readings.get(pair[1])
            if limit is not None and limit > 0:
                found.append((pair[0], used, limit))
    return found


def _any_count(values: Iterable[float]) -> bool:
    # a NaN count is as alarming as a positive one: `!= 0` keeps it
    return bool(np.any(np.asarray(values, dtype=np.float64) != 0))


def _all_finite(values: Iterable[float]) -> bool:
    return bool(np.all(np.isfinite(np.asarray(values, dtype=np.float64))))
