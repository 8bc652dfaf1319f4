"""The per-second sampler: one daemon thread reads every source on a fixed schedule.

The schedule runs on a monotonic clock, so intervals do not drift with the time a sample
takes; the loop waits on ``stop_event.wait(...)``, so ``stop()`` is instant. A source that
fails is reported once and dropped; the others carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    from trainvitals.agent.gpu import GpuDescription
    from trainvitals.agent.host import HostDescription

log = logging.getLogger("trainvitals")


#: What a source tells of the machine, shown under its name in the run's environment.
SourceDescription: TypeAlias = "GpuDescription | HostDescription"


class Source(Protocol):
    """Something the sampler reads every interval (the host, a GPU library): ``sample()``
    gives series values by name, ``describe()`` what it tells of the machine."""

    name: str

    def describe(self) -> SourceDescription: ...

    def sample(self) -> dict[str, float]: ...


class Sampler:
    """Calls ``record(values)`` every ``interval`` seconds with what the sources read.

    Args:
        sources: what to read (see :mod:`trainvitals.agent.host` and :mod:`trainvitals.agent.gpu`).
        record: where the values go (the run's buffer).
        interval: seconds between samples (default 1).
        clock: a monotonic clock; injected by tests.
        wait: waits up to its argument in seconds and says whether to stop; by default the
            stop event's ``wait``, so :meth:`stop` is instant. Injected by tests, with
            ``clock``, to run the schedule on fake time.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        record: Callable[[Mapping[str, float]], None],
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self.sources = list(sources)
        self._record = record
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._wait = self._stop.wait if wait is None else wait
        self._thread = threading.Thread(target=self._run, name="trainvitals-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def sample_once(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for source in list(self.sources):
            try:
                values.update(source.sample())
            except Exception as exc:
                log.warning(
                    "trainvitals: %s readings stopped: %s: %s", source.name, type(exc).__name__, exc
                )
                self.sources.remove(source)
        if values:
            self._record(values)
        return values

    def _run(self) -> None:
        due = self._clock()
        while True:
            self.sample_once()
            due += self._interval
            now = self._clock()
            if due < now:  # fell behind (suspended, swapping): skip, don't burst
                due = now + self._interval
            if self._wait(due - now):
                return
