"""Resolve the agent's settings from arguments, then environment variables, then defaults."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

from trainvitals.exceptions import ConfigurationError
from trainvitals.json_types import Json, JsonObject
from trainvitals.protocol import INGEST_PATH

DEFAULT_SERVER = "http://127.0.0.1:8600"
DEFAULT_PROJECT = "default"
DEFAULT_SPOOL_MAX_BYTES = 512 * 2**20
DEFAULT_SPOOL_AFTER_BYTES = 32 * 2**20
#: Rows of the device ring the in-step vitals wait in (see :mod:`trainvitals.agent.ring`): at
#: 0.2 s between reads, room for steps of 0.4 ms and up before the training thread has to
#: read for itself (every ``capacity // 2`` steps).
DEFAULT_RING_CAPACITY = 1024
#: The most seconds a recorded point waits before it is sent, when nothing is urgent (see
#: :mod:`trainvitals.agent.urgency`). Each frame costs the server about 2 ms of CPU whatever
#: it holds: one a second instead of five took a server's CPU a step from +33 to +17 µs on a
#: 2 ms MLP and from +167 to +67 µs on a 17 ms CNN (``benchmarks/agent_overhead.py``).
DEFAULT_FLUSH_INTERVAL = 1.0
#: Seconds between two looks at what training recorded (the device ring read, the hang check,
#: the NaN/Inf and gradient-rise checks that send at once): what an urgent point waits at most.
DEFAULT_READ_INTERVAL = 0.2


def default_spool_dir() -> Path:
    """``$XDG_CACHE_HOME/trainvitals/spool``, else ``~/.cache/trainvitals/spool``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "trainvitals" / "spool"


@dataclass(frozen=True)
class AgentConfig:
    """Where and as what a run reports. Build it with :func:`resolve`."""

    server: str
    project: str
    run_name: str
    token: str | None
    #: Hyper-parameters shown with the run; a value JSON cannot hold is shown as its ``str``.
    config: JsonObject = field(default_factory=dict)
    #: The most seconds a point waits before it is sent, unless it is urgent.
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    #: Seconds between looks at what training recorded; at most ``flush_interval``.
    read_interval: float = DEFAULT_READ_INTERVAL
    #: Seconds without anything sent before a heartbeat goes out ($TRAINVITALS_HEARTBEAT_INTERVAL).
    heartbeat_interval: float = 5.0
    #: A stall is max(stall_factor x p95 step interval, stall_floor) seconds without a step
    #: ($TRAINVITALS_STALL_FACTOR, $TRAINVITALS_STALL_FLOOR).
    stall_factor: float = 10.0
    stall_floor: float = 30.0
    #: Where each run spools frames the server has not acknowledged, in a subdirectory of its
    #: own, when more than ``spool_after_bytes`` of them pile up ($TRAINVITALS_SPOOL_DIR).
    spool_dir: Path = field(default_factory=default_spool_dir)
    #: The most bytes one run's spool takes on disk ($TRAINVITALS_SPOOL_MAX_BYTES).
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    #: Unacknowledged frames held in memory before the spool takes the rest
    #: ($TRAINVITALS_SPOOL_AFTER_BYTES).
    spool_after_bytes: int = DEFAULT_SPOOL_AFTER_BYTES

    @property
    def ingest_url(self) -> str:
        return websocket_url(self.server, INGEST_PATH)

    def run_ingest_url(self, run_id: str) -> str:
        return run_ingest_url(self.server, run_id)


def run_ingest_url(server: str, run_id: str) -> str:
    """The ingest URL that names the run, so that a load balancer sends every connection
    of one run, its watchdog's and a later ``trainvitals sync``'s too, to the same replica
    (``deploy/nginx.conf``)."""
    return f"{websocket_url(server, INGEST_PATH)}?{urlencode({'run': run_id})}"


def websocket_url(server: str, path: str) -> str:
    """Turn ``http://host:port`` (or ``ws://``) into the websocket URL of ``path``."""
    parts = urlsplit(server)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ConfigurationError(
            f"Expected a server URL like 'http://10.0.0.5:8600', but got {server!r}"
        )
    base = parts.path.rstrip("/")
    return urlunsplit((scheme, parts.netloc, base + path, "", ""))


def generate_run_name() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def _positive_env(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ConfigurationError(f"${name} must be a positive number of seconds, got {text!r}")
    return value


def _bytes_setting(name: str, given: int | None, default: int) -> int:
    """``given``, else ``$name``, else ``default``: a positive whole number of bytes."""
    text = str(given) if given is not None else os.environ.get(name) or str(default)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigurationError(
            f"{name.removeprefix('TRAINVITALS_').lower()} (${name}) must be a positive whole "
            f"number of bytes, got {text!r}"
        )
    return value


def resolve(
    server: str | None = None,
    project: str | None = None,
    run_name: str | None = None,
    token: str | None = None,
    config: Mapping[str, Json] | None = None,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    *,
    read_interval: float = DEFAULT_READ_INTERVAL,
    spool_dir: str | os.PathLike[str] | None = None,
    spool_max_bytes: int | None = None,
    spool_after_bytes: int | None = None,
) -> AgentConfig:
    """Fill unset settings from ``TRAINVITALS_*`` variables, then defaults, and check them.

    Example:
        ```python
        config = resolve(server="http://10.0.0.5:8600", project="mnist",
                         spool_dir="/scratch/trainvitals-spool")
        ```
    """
    resolved = AgentConfig(
        server=server or os.environ.get("TRAINVITALS_SERVER") or DEFAULT_SERVER,
        project=project or os.environ.get("TRAINVITALS_PROJECT") or DEFAULT_PROJECT,
        run_name=run_name or generate_run_name(),
        token=token or os.environ.get("TRAINVITALS_TOKEN") or None,
        config=dict(config or {}),
        flush_interval=flush_interval,
        read_interval=min(read_interval, flush_interval),
        heartbeat_interval=_positive_env("TRAINVITALS_HEARTBEAT_INTERVAL", 5.0),
        stall_factor=_positive_env("TRAINVITALS_STALL_FACTOR", 10.0),
        stall_floor=_positive_env("TRAINVITALS_STALL_FLOOR", 30.0),
        spool_dir=Path(
            spool_dir or os.environ.get("TRAINVITALS_SPOOL_DIR") or default_spool_dir()
        ).expanduser(),
        spool_max_bytes=_bytes_setting(
            "TRAINVITALS_SPOOL_MAX_BYTES", spool_max_bytes, DEFAULT_SPOOL_MAX_BYTES
        ),
        spool_after_bytes=_bytes_setting(
            "TRAINVITALS_SPOOL_AFTER_BYTES", spool_after_bytes, DEFAULT_SPOOL_AFTER_BYTES
        ),
    )
    resolved.ingest_url  # noqa: B018 - validates the URL now, not in the sender thread
    for name, value in (("flush_interval", flush_interval), ("read_interval", read_interval)):
        if not value > 0:
            raise ConfigurationError(f"{name} must be > 0 seconds, got {value!r}")
    return resolved
