"""The types and constants the agent, the detection core and the server share.

The full description of the frames lives in ``docs/protocol.md``; the contract (statuses, end
reasons, series names) in ``docs/contract.md``. This module is plain Python (numpy appears in
annotations only) so the light agent can import it.

- :class:`Columns`: one series' points, column by column. The one shape of the core data:
  the agent buffers ``Columns`` of lists, the server stores and the detectors judge
  ``Columns`` of numpy arrays.
- :class:`ClockedSeries`: many series' points with each :class:`Clock` (the steps and times
  several series share) held once: a ``points`` frame as the server keeps it from validation
  through storage, the detector and the live push.
- :class:`RunStatus` and :class:`EndReason`: where a run is in its life and how it ended
  (what moves it between statuses is :mod:`trainvitals.server.run_lifecycle`).
- The frame types and their limits, and the websocket close codes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Final,
    Generic,
    NamedTuple,
    NotRequired,
    TypeAlias,
    TypedDict,
    TypeVar,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_Steps = TypeVar("_Steps", covariant=True)
_Values = TypeVar("_Values", covariant=True)


class Columns(NamedTuple, Generic[_Steps, _Values]):
    """One series' points, column by column: step numbers, Unix times (seconds), values.

    A tuple, so ``steps, times, values = columns`` works; the column type is a parameter:
    :data:`ListColumns` where points are gathered, :data:`ArrayColumns` where they are judged
    or read back from storage.

    Example:
        >>> Columns([1, 2], [1700000000.0, 1700000000.1], [0.7, 0.69]).steps
        [1, 2]
    """

    steps: _Steps
    times: _Values
    values: _Values


#: Columns being gathered (the agent's buffer, a frame as sent or validated).
ListColumns: TypeAlias = Columns[list[int], list[float]]
#: Columns to read: lists or slices of them.
SeqColumns: TypeAlias = Columns[Sequence[int], Sequence[float]]
#: Columns whatever holds them: lists, slices or numpy arrays.
AnyColumns: TypeAlias = "Columns[npt.ArrayLike, npt.ArrayLike]"
#: Columns as numpy arrays (the detectors' bulk pass, storage reads).
ArrayColumns: TypeAlias = "Columns[npt.NDArray[np.int64], npt.NDArray[np.float64]]"
#: Many series' points, by series name (see :mod:`trainvitals.series`).
Series: TypeAlias = Mapping[str, ListColumns]

_S = TypeVar("_S")
_V = TypeVar("_V")


class Clock(NamedTuple, Generic[_Steps, _Values]):
    """Steps and Unix times that several series were recorded at (a fit's vitals and its
    Keras metrics at every step; its per-variable gradient norms at theirs)."""

    steps: _Steps
    times: _Values


class ClockedSeries(Mapping[str, Columns[_Steps, _Values]]):
    """Many series' points with each clock held once, as the ``points`` frame carries them
    (``docs/protocol.md``): the frame as the server keeps it from validation through storage,
    the detector and the live push, none of which has to find again which series share.

    A mapping of each series' name to its :class:`Columns`, like a dict of them (the columns
    of the series on one clock hold that clock's very steps and times); :attr:`series` says
    which clock each series is on.

    Example:
        >>> clock = Clock([1, 2], [1700000000.0, 1700000000.1])
        >>> points = ClockedSeries([clock], {"loss": (0, [0.7, 0.69]), "lr": (0, [1e-3, 1e-3])})
        >>> points["lr"].steps is points["loss"].steps
        True
    """

    __slots__ = ("clocks", "series")

    def __init__(
        self, clocks: Sequence[Clock[_Steps, _Values]], series: Mapping[str, tuple[int, _Values]]
    ) -> None:
        #: The clocks, each once.
        self.clocks = clocks
        #: Each series' clock (an index into :attr:`clocks`) and values, in the frame's order.
        self.series = series

    @staticmethod
    def of(points: Mapping[str, Columns[_S, _V]]) -> ClockedSeries[_S, _V]:
        """``points`` as they are when clocked already; else each series on a clock of its
        own (series that merely hold equal numbers are not looked for: what comes in plain,
        from an older agent, a replay or a test, goes on plain)."""
        if isinstance(points, ClockedSeries):
            return points
        clocks: list[Clock[_S, _V]] = []
        series: dict[str, tuple[int, _V]] = {}
        for name, (steps, times, values) in points.items():
            series[name] = (len(clocks), values)
            clocks.append(Clock(steps, times))
        return ClockedSeries(clocks, series)

    def __getitem__(self, name: str) -> Columns[_Steps, _Values]:
        index, values = self.series[name]
        steps, times = self.clocks[index]
        return Columns(steps, times, values)

    def __iter__(self) -> Iterator[str]:
        return iter(self.series)

    def __len__(self) -> int:
        return len(self.series)

    def __repr__(self) -> str:
        return f"ClockedSeries({list(self.clocks)!r}, {dict(self.series)!r})"

    def sharing(self) -> list[int]:
        """How many series each clock (by index) is the clock of."""
        counts = [0] * len(self.clocks)
        for index, _ in self.series.values():
            counts[index] += 1
        return counts


class RunStatus(enum.StrEnum):
    """Where a run is in its life; :mod:`trainvitals.server.run_lifecycle` says what moves it."""

    RUNNING = "running"
    #: No step for far longer than usual while the process is alive.
    STALLED = "stalled"
    #: Ended by completing.
    FINISHED = "finished"
    #: Ended any other way: an exception, a signal, an OOM kill.
    CRASHED = "crashed"
    #: Went silent (no frame, not even a heartbeat): the host died or the network was cut.
    LOST = "lost"


class EndReason(enum.StrEnum):
    """How a run ended (``end_reason``). A run killed by a signal ends with
    ``signal:<NAME>`` (:func:`signal_reason`), so the reason is a plain string on the wire."""

    COMPLETED = "completed"
    #: An exception left training; the traceback comes with it.
    EXCEPTION = "exception"
    #: The process ended without a signal or an exception (``sys.exit`` in the middle).
    EXITED = "exited"
    #: The kernel's OOM killer took the process (seen in its cgroup's counters).
    OOM_KILLED = "oom_killed"
    #: The interpreter aborted (``Fatal Python error``).
    FATAL_ERROR = "fatal_error"
    #: Nothing heard from the run for the server's ``lost_after``.
    HEARTBEAT_LOST = "heartbeat_lost"
    SIGKILL = "signal:SIGKILL"
    SIGTERM = "signal:SIGTERM"
    SIGINT = "signal:SIGINT"
    SIGSEGV = "signal:SIGSEGV"


def signal_reason(name: str) -> str:
    """The end reason of a run killed by the signal ``name``: ``signal_reason("SIGTERM")``."""
    return f"signal:{name}"


def whole_micros(seconds: float) -> float:
    """A Unix time to the microsecond, as the agent sends points' times: finer than any step is
    timed, and stored in fewer bytes (the server's codec keeps such times as whole
    microseconds). ``whole_micros(1795317434.1234567) == 1795317434.123457``."""
    return math.floor(seconds * 1e6 + 0.5) / 1e6


#: Version carried in every frame as ``"v"``. The server rejects versions it does not speak.
#: What no name or message from the wire may hold, as a regular expression's character class
#: (read alike by Python's ``re`` and pydantic's Rust engine): C0 and C1 controls (U+0085
#: included), the line and paragraph separators (``str.splitlines()`` breaks lines on them: a
#: name would forge a log line), and the bidirectional marks and overrides (they reorder what
#: a terminal shows).
UNSAFE_CHARS: Final = r"\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069"

PROTOCOL_VERSION: Final = 1

INGEST_PATH: Final = "/api/v1/ingest"
LIVE_PATH: Final = "/api/v1/live"

#: Largest text frame the server accepts; the agent splits batches to stay under it.
MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
#: The agent never packs more points than this into one frame.
MAX_POINTS_PER_FRAME: Final = 50_000

# Agent -> server frame types.
HELLO: Final = "hello"
#: The hello env's list of the model's trainable variables' paths, in model order (as the
#: ``grad/norm/<path>`` series name them): the detector's model order on a replay too.
VARIABLE_ORDER: Final = "variable_order"
#: The hello env's loss at chance for a classifier: ``{"loss", "classes", "value"}``, the
#: loss of a model that gives every class the same probability (ln of the classes for a
#: cross-entropy); absent where the agent cannot tell (a regression, a custom loss).
LOSS_AT_CHANCE: Final = "loss_at_chance"
POINTS: Final = "points"
END: Final = "end"
#: No step for far longer than usual: carries every thread's stack. Numbered like points.
STALL: Final = "stall"
#: Where the first NaN/Inf came from (see ``trainvitals.agent.autopsy``). Numbered like points.
AUTOPSY: Final = "autopsy"
#: Sent when nothing else was sent for a while: the run is alive even if no step completes.
HEARTBEAT: Final = "heartbeat"
# Server -> agent frame types.
WELCOME: Final = "welcome"
ACK: Final = "ack"
#: A warning or critical alert of the run, firing: sent only to an agent whose hello lists
#: :data:`ACCEPTS_ALERTS` in ``"accepts"`` (an older agent, which does not, never gets one).
ALERT: Final = "alert"

#: What an agent lists in its hello's ``"accepts"`` to be sent its run's ``alert`` frames.
#: An older server ignores the field (hellos are read with unknown fields ignored).
ACCEPTS_ALERTS: Final = "alerts"

#: What a server that lists it in its welcome's ``"features"`` reads: ``points`` frames whose
#: series share their steps and times through the frame's ``"clocks"`` (``docs/protocol.md``).
#: An agent sends that form only to a server that says so; every server reads the plain one.
FEATURE_CLOCKS: Final = "clocks"

# Websocket close codes the server uses for bad input (RFC 6455, section 7.4.1).
CLOSE_UNSUPPORTED_DATA: Final = 1003  # binary frame where text JSON was expected
CLOSE_INVALID_PAYLOAD: Final = 1007  # not JSON, or JSON that is not a valid frame
CLOSE_POLICY_VIOLATION: Final = 1008  # valid frame in the wrong place (points before hello, ...)
CLOSE_TOO_BIG: Final = 1009  # frame over MAX_FRAME_BYTES
CLOSE_INTERNAL_ERROR: Final = 1011  # the server failed on a frame (a bug): the agent resends it
#: A browser too slow to keep up with the live stream; a cap reached; the server's database
#: cannot store now or the server is stopping: the agent reconnects and resends.
CLOSE_TRY_AGAIN_LATER: Final = 1013

#: Older names of two end reasons, kept for scripts that import them: use :class:`EndReason`.
END_COMPLETED: Final = EndReason.COMPLETED.value
END_EXCEPTION: Final = EndReason.EXCEPTION.value


# The frames as the agent builds them (the server validates them again: server/schemas.py).
class JobInfo(TypedDict):
    """This process's place in a job of several processes (see ``agent.environment.job``)."""

    key: str
    worker: str
    size: int | None
    source: str


class ProcessInfo(TypedDict):
    """The training process that makes a run (see ``agent.environment.process``): the runs of
    one process (a loop of fits) share ``key``."""

    key: str
    started_at: float


class HelloFrame(TypedDict):
    """The first frame of every connection: which run this is, where and what it runs."""

    type: str
    v: int
    run_id: str
    project: str
    name: str
    config: dict[str, object]
    host: str
    pid: int
    started_at: float
    env: dict[str, object]
    job: JobInfo | None
    #: The training process: the server links its runs and judges its memory across them.
    process: NotRequired[ProcessInfo]
    #: The secret the server issued in the run's first welcome, in every later hello.
    run_secret: NotRequired[str]
    #: True in the hello of the run's watchdog, which reports how a dead process ended: the
    #: server reads the process's own connection to its end before answering.
    watchdog: NotRequired[bool]
    #: The server -> agent frames this agent takes beyond welcome and ack (:data:`ACCEPTS_ALERTS`).
    accepts: NotRequired[list[str]]


class EndFrame(TypedDict):
    """The last frame of a run: how it ended."""

    type: str
    v: int
    seq: int
    reason: str
    time: float
    traceback: str | None


def end_frame(seq: int, reason: str, time: float, traceback: str | None = None) -> EndFrame:
    """The ``end`` frame, as the agent's sender and its watchdog both send it."""
    return {
        "type": END,
        "v": PROTOCOL_VERSION,
        "seq": seq,
        "reason": reason,
        "time": time,
        "traceback": traceback,
    }
