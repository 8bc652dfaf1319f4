"""Typed agent frames, validated at the server boundary (see ``docs/protocol.md``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from trainvitals.exceptions import FrameError
from trainvitals.protocol import AUTOPSY, END, HEARTBEAT, HELLO, POINTS, PROTOCOL_VERSION, STALL

SeriesName = Annotated[str, Field(min_length=1, max_length=256)]
Version = Literal[1]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    v: Version


class Hello(_Frame):
    type: Literal["hello"]
    run_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    project: Annotated[str, Field(min_length=1, max_length=200)]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    config: dict[str, Any] = Field(default_factory=dict)
    host: str = ""
    pid: int = 0
    started_at: float
    env: dict[str, Any] = Field(default_factory=dict)
    job: Job | None = None


class Job(BaseModel):
    """The job of several processes this run is one worker of (``environment.job``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    key: Annotated[str, Field(min_length=1, max_length=128)]
    worker: Annotated[str, Field(min_length=1, max_length=64)]
    size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class WireColumns(BaseModel):
    """One series' points as a frame carries them (``step``, ``time``, ``value`` lists),
    validated; :meth:`columns` gives them as :class:`~trainvitals.protocol.Columns`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: list[int]
    time: list[float]
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
    seq: Annotated[int, Field(ge=1)]
    series: dict[SeriesName, WireColumns]


class Heartbeat(_Frame):
    """The agent is alive; not numbered, not acknowledged."""

    type: Literal["heartbeat"]
    time: float


class Stall(_Frame):
    """No step for far longer than usual; where every thread is."""

    type: Literal["stall"]
    seq: Annotated[int, Field(ge=1)]
    time: float
    idle: float
    threshold: float
    stacks: Annotated[str, Field(max_length=1_000_000)]


class Autopsy(_Frame):
    """Where a run's first NaN/Inf came from, worked out by the agent."""

    type: Literal["autopsy"]
    seq: Annotated[int, Field(ge=1)]
    time: float
    step: int
    report: dict[str, Any]


class End(_Frame):
    type: Literal["end"]
    seq: Annotated[int, Field(ge=1)]
    reason: Annotated[str, Field(min_length=1, max_length=200)]
    time: float
    traceback: str | None = None


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
    kind, *loc = error["loc"]  # a discriminated union puts the frame type first
    if loc == ["v"]:
        raise FrameError(
            f"unsupported protocol version {error.get('input')!r}; "
            f"this server speaks v{PROTOCOL_VERSION}"
        )
    where = ".".join(str(part) for part in loc) or "top level"
    raise FrameError(f"invalid {kind} frame at {where}: {error['msg']}")
