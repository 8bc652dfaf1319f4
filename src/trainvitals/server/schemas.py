"""Typed agent frames, validated at the server boundary (see ``docs/protocol.md``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from trainvitals.exceptions import FrameError
from trainvitals.protocol import (
    AUTOPSY,
    END,
    HEARTBEAT,
    HELLO,
    POINTS,
    PROTOCOL_VERSION,
    STALL,
    UNSAFE_CHARS,
    ClockedSeries,
)
from trainvitals.protocol import Clock as ProtocolClock

#: The largest integer the database columns hold (BIGINT).
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Seq = Annotated[int, Field(ge=1, le=INT64_MAX)]
#: How far a frame's ``seq`` may run ahead of the last one stored: gaps are allowed (frames an
#: agent's full spool gave up), a forged ``seq`` near 2^63 that would swallow the run's later
#: frames is not.
MAX_SEQ_AHEAD = 10_000_000
#: The most points one ``points`` frame may carry: ten times what the agent packs
#: (``protocol.MAX_POINTS_PER_FRAME``). Without clocks, the 4 MiB frame limit held a frame to
#: some 700,000 points at the fewest bytes a point can take; with them a point can be two
#: bytes of value, so the frame's size alone would let one frame cost the server three times
#: as much work.
MAX_FRAME_POINTS = 500_000
#: Steps stay exact in a browser's numbers (2^53) and far from the columns' limit.
STEP_MAX = 2**53 - 1
Step = Annotated[int, Field(ge=0, le=STEP_MAX)]
#: Times must be finite: they order and key what is stored. Unix seconds up to the year
#: 2286: ``started_at = 1e300`` is not a time a run starts at, and sorts every run after it.
MAX_TIME = 1e10
Time = Annotated[float, Field(allow_inf_nan=False, ge=0.0, le=MAX_TIME)]
_PRINTABLE = rf"^[^{UNSAFE_CHARS}]+$"
SeriesName = Annotated[str, Field(min_length=1, max_length=256, pattern=_PRINTABLE)]
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=_PRINTABLE)]
#: Free text (tracebacks, stacks): newlines allowed, NUL never (PostgreSQL refuses it).
Text = Annotated[str, Field(max_length=1_000_000, pattern=r"^[^\x00]*$")]
Version = Literal[1]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    v: Version


class Hello(_Frame):
    type: Literal["hello"]
    run_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    project: Name
    name: Name
    config: dict[str, Any] = Field(default_factory=dict)
    host: Annotated[str, Field(max_length=255, pattern=rf"^[^{UNSAFE_CHARS}]*$")] = ""
    pid: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    started_at: Time
    env: dict[str, Any] = Field(default_factory=dict)
    job: Job | None = None
    #: The training process that makes this run (``environment.process``).
    process: Process | None = None
    #: The secret the server issued in this run's first welcome: proves a reconnect is the run.
    run_secret: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    #: Said by the run's watchdog, reporting the ending of a process that died: its ``end``
    #: waits for the frames the process sent before it died (``connections.OpenRuns``).
    watchdog: bool = False
    #: The server -> agent frames this agent takes beyond welcome and ack (``"alerts"``).
    accepts: Annotated[list[Annotated[str, Field(max_length=32)]], Field(max_length=16)] = Field(
        default_factory=list
    )


class Job(BaseModel):
    """The job of several processes this run is one worker of (``environment.job``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    key: Annotated[str, Field(min_length=1, max_length=128, pattern=_PRINTABLE)]
    worker: Annotated[str, Field(min_length=1, max_length=64, pattern=_PRINTABLE)]
    size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class Process(BaseModel):
    """The training process a run belongs to: its runs share ``key`` (host, pid and the
    process's start time, as the agent makes it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    key: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
    started_at: Time


#: A clock's name in a ``points`` frame (the agent numbers them: "0", "1", ...).
ClockName = Annotated[str, Field(min_length=1, max_length=64, pattern=_PRINTABLE)]


class Clock(BaseModel):
    """Steps and times that several series of a ``points`` frame share (the steps one
    ``fit`` recorded its vitals at), sent once instead of once a series."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: list[Step]
    time: list[Time]

    @model_validator(mode="after")
    def _same_length(self) -> Clock:
        if len(self.step) != len(self.time):
            raise ValueError(
                f"step and time must have equal lengths, got {len(self.step)}, {len(self.time)}"
            )
        return self


class WireColumns(BaseModel):
    """One series' points as a frame carries them: ``step``, ``time`` and ``value`` lists, or
    ``value`` and the name of the frame's ``clock`` that holds its steps and times."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: list[Step] | None = None
    time: list[Time] | None = None
    clock: ClockName | None = None
    value: list[float]  # NaN and ±Infinity are data here, sent as JSON NaN/Infinity tokens

    @model_validator(mode="after")
    def _same_length(self) -> WireColumns:
        if self.clock is not None:
            if self.step is not None or self.time is not None:
                raise ValueError("a series names a clock or has step and time, not both")
            return self
        if self.step is None or self.time is None:
            raise ValueError("a series needs step and time, or a clock")
        if not len(self.step) == len(self.time) == len(self.value):
            raise ValueError(
                f"step, time and value must have equal lengths, got "
                f"{len(self.step)}, {len(self.time)}, {len(self.value)}"
            )
        return self


class Points(_Frame):
    type: Literal["points"]
    seq: Seq
    series: dict[SeriesName, WireColumns]
    #: Steps and times shared by the series that name them (``protocol.FEATURE_CLOCKS``).
    clocks: dict[ClockName, Clock] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _within_limits(self) -> Points:
        points = sum(len(column.value) for column in self.series.values())
        if points > MAX_FRAME_POINTS:
            raise ValueError(f"{points} points in one frame, more than {MAX_FRAME_POINTS}")
        for name, column in self.series.items():
            if column.clock is None:
                continue
            clock = self.clocks.get(column.clock)
            if clock is None:
                raise ValueError(f"series {_quoted(name)} names a clock the frame does not hold")
            if len(clock.step) != len(column.value):
                raise ValueError(
                    f"series {_quoted(name)} has {len(column.value)} values for its clock's "
                    f"{len(clock.step)} steps"
                )
        return self

    def columns(self) -> ClockedSeries[list[int], list[float]]:
        """The frame's points as it carries them: each clock a series names once, a series
        with its own steps and times on a clock of its own; the validated lists, not copies."""
        clocks: list[ProtocolClock[list[int], list[float]]] = []
        index: dict[str, int] = {}  # the frame's clock names, by their place in ``clocks``
        series: dict[str, tuple[int, list[float]]] = {}
        for name, column in self.series.items():
            if column.clock is None:
                assert column.step is not None and column.time is not None
                series[name] = (len(clocks), column.value)
                clocks.append(ProtocolClock(column.step, column.time))
                continue
            at = index.get(column.clock)
            if at is None:
                clock = self.clocks[column.clock]
                at = index[column.clock] = len(clocks)
                clocks.append(ProtocolClock(clock.step, clock.time))
            series[name] = (at, column.value)
        return ClockedSeries(clocks, series)


class Heartbeat(_Frame):
    """The agent is alive; not numbered, not acknowledged."""

    type: Literal["heartbeat"]
    time: Time


class Stall(_Frame):
    """No step for far longer than usual; where every thread is."""

    type: Literal["stall"]
    seq: Seq
    time: Time
    idle: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    threshold: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    stacks: Text


class Autopsy(_Frame):
    """Where a run's first NaN/Inf came from, worked out by the agent."""

    type: Literal["autopsy"]
    seq: Seq
    time: Time
    step: Step
    report: dict[str, Any]


class End(_Frame):
    type: Literal["end"]
    seq: Seq
    reason: Name
    time: Time
    traceback: Text | None = None


def _quoted(name: str) -> str:
    """A client's name for a reason: escaped and cut short."""
    return repr(name.encode("unicode_escape").decode()[:40])


AnyFrame = Hello | Points | Heartbeat | Stall | Autopsy | End
Frame = Annotated[AnyFrame, Field(discriminator="type")]
_frame_adapter: TypeAdapter[AnyFrame] = TypeAdapter(Frame)


def parse_frame(text: str | bytes) -> AnyFrame:
    """Validate one agent frame, or raise :class:`FrameError` with a reason fit for a close."""
    try:
        return _frame_adapter.validate_json(text)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
    if error["type"] == "json_invalid":
        raise FrameError(f"not valid JSON: {error['msg']}")
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        raise FrameError(
            f"unknown frame type; expected one of {HELLO!r}, {POINTS!r}, {HEARTBEAT!r}, "
            f"{STALL!r}, {AUTOPSY!r}, {END!r}"
        )
    if not error["loc"]:  # a top-level [] or null
        raise FrameError(f"expected a JSON object, got {type(error.get('input')).__name__}")
    kind, *loc = error["loc"]  # a discriminated union puts the frame type first
    if loc == ["v"]:
        raise FrameError(
            f"unsupported protocol version {error.get('input')!r}; "
            f"this server speaks v{PROTOCOL_VERSION}"
        )
    # The location may hold a client's key (a series name): escaped, so no reason or log line
    # carries its control characters.
    where = ".".join(str(part) for part in loc).encode("unicode_escape").decode()[:80]
    where = where or "top level"
    raise FrameError(f"invalid {kind} frame at {where}: {error['msg']}")
