"""What one token may take of the server, so no single client exhausts it.

Counted per token (without auth, all clients share the one local principal) in this server
process: ingest connections open at once, new runs a minute, series per run, and bytes of
frames per UTC day. Each refusal is a websocket close with a code and a reason that names the
cap and the setting that raises it; other clients carry on.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from trainvitals.exceptions import IngestRejected
from trainvitals.protocol import CLOSE_POLICY_VIOLATION, CLOSE_TRY_AGAIN_LATER


@dataclass(frozen=True)
class Caps:
    """The caps, from the server's settings."""

    connections: int = 1000
    runs_per_minute: int = 600
    series_per_run: int = 2000
    bytes_per_day: int = 50 * 2**30


class Quotas:
    """The counters behind :class:`Caps`, one set per token id."""

    def __init__(self, caps: Caps, clock: Callable[[], float] = time.time) -> None:
        self.caps = caps
        self._clock = clock
        self._connections: dict[str, int] = defaultdict(int)
        self._new_runs: dict[str, deque[float]] = defaultdict(deque)
        self._bytes: dict[str, tuple[int, int]] = {}  # token -> (UTC day, bytes that day)

    def connect(self, token: str) -> None:
        """An ingest connection opens; refused past the cap (1013: try again later)."""
        if self._connections[token] >= self.caps.connections:
            raise IngestRejected(
                CLOSE_TRY_AGAIN_LATER,
                f"this token has {self.caps.connections} connections open already "
                "(TRAINVITALS_MAX_CONNECTIONS)",
            )
        self._connections[token] += 1

    def disconnect(self, token: str) -> None:
        self._connections[token] = max(0, self._connections[token] - 1)

    def new_run(self, token: str) -> None:
        """A run is about to be created; refused past the cap of the last 60 seconds."""
        now = self._clock()
        made = self._new_runs[token]
        while made and made[0] <= now - 60.0:
            made.popleft()
        if len(made) >= self.caps.runs_per_minute:
            raise IngestRejected(
                CLOSE_TRY_AGAIN_LATER,
                f"this token made {self.caps.runs_per_minute} runs in the last minute "
                "(TRAINVITALS_MAX_RUNS_PER_MINUTE)",
            )
        made.append(now)

    def series(self, count: int) -> None:
        """A run would hold ``count`` series."""
        if count > self.caps.series_per_run:
            raise IngestRejected(
                CLOSE_POLICY_VIOLATION,
                f"a run may hold {self.caps.series_per_run} series, this one would hold "
                f"{count} (TRAINVITALS_MAX_SERIES_PER_RUN)",
            )

    def received(self, token: str, size: int) -> None:
        """``size`` bytes of frames arrived; refused past the day's cap."""
        day = int(self._clock() // 86400)
        seen_day, total = self._bytes.get(token, (day, 0))
        total = (total if seen_day == day else 0) + size
        self._bytes[token] = (day, total)
        if total > self.caps.bytes_per_day:
            raise IngestRejected(
                CLOSE_TRY_AGAIN_LATER,
                f"this token sent over {self.caps.bytes_per_day} bytes today "
                "(TRAINVITALS_MAX_BYTES_PER_DAY)",
            )
