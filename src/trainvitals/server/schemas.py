"""Typed agent frames, validated at the server boundary (see ``docs/protocol.md``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from trainvitals.exceptions import FrameError
from trainvitals.protocol import AUTOPSY, END, HEARTBEAT, HELLO, POINTS, PROTOCOL_VERSION, STALL

#: The largest integer the database columns hold (BIGINT).
INT64_MAX = 2**63 - 1
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Seq = Annotated[int, Field(ge=1, le=INT64_MAX)]
#: How far a frame's ``seq`` may run ahead of the last one stored: gaps are allowed (frames an
#: agent's full spool gave up), a forged ``seq`` near 2^63 that would swallow the run's later
#: frames is not.
MAX_SEQ_AHEAD = 10_000_000
#: Steps stay exact in a browser's numbers (2^53) and far from the columns' limit.
STEP_MAX = 2**53 - 1
Step = Annotated[int, Field(ge=0, le=STEP_MAX)]
#: Times must be finite: they order and key what is stored.
Time = Annotated[float, Field(allow_inf_nan=False)]
#: Printable names: no control characters (a newline in a name would forge log lines).
SeriesName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
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
    host: Annotated[str, Field(max_length=255, pattern=r"^[^\x00-\x1f\x7f]*$")] = ""
    pid: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    started_at: Time
    env: dict[str, Any] = Field(default_factory=dict)
    job: Job | None = None
    #: The secret the server issued in this run's first welcome: proves a reconnect is the run.
    run_secret: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    #: Said by the run's watchdog, reporting the ending of a process that died: its ``end``
    #: waits for the frames the process sent before it died (``connections.OpenRuns``).
    watchdog: bool = False


class Job(BaseModel):
    """The job of several processes this run is one worker of (``environment.job``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    key: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
    worker: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")]
    size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class WireColumns(BaseModel):
    """One series' points as a frame carries them (``step``, ``time``, ``value`` lists),
    validated; :meth:`columns` gives them as :class:`~trainvitals.protocol.Columns`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: list[Step]
    time: list[Time]
    value: list[float]  # NaN and ±Infinity are data here, sent as JSON NaN/Infinity tokens

    @model_validator(mode="after")
    def _same_length(self) -> WireColumns:
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
