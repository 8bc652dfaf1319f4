"""Resolve the agent's settings from arguments, then environment variables, then defaults."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from trainvitals.exceptions import ConfigurationError
from trainvitals.protocol import INGEST_PATH

DEFAULT_SERVER = "http://127.0.0.1:8600"
DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class AgentConfig:
    """Where and as what a run reports. Build it with :func:`resolve`."""

    server: str
    project: str
    run_name: str
    token: str | None
    config: dict[str, Any] = field(default_factory=dict)
    flush_interval: float = 0.2
    #: Seconds without anything sent before a heartbeat goes out ($TRAINVITALS_HEARTBEAT_INTERVAL).
    heartbeat_interval: float = 5.0
    #: A stall is max(stall_factor x p95 step interval, stall_floor) seconds without a step
    #: ($TRAINVITALS_STALL_FACTOR, $TRAINVITALS_STALL_FLOOR).
    stall_factor: float = 10.0
    stall_floor: float = 30.0

    @property
    def ingest_url(self) -> str:
        return websocket_url(self.server, INGEST_PATH)


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


def resolve(
    server: str | None = None,
    project: str | None = None,
    run_name: str | None = None,
    token: str | None = None,
    config: dict[str, Any] | None = None,
    flush_interval: float = 0.2,
) -> AgentConfig:
    """Fill unset settings from ``TRAINVITALS_*`` variables, then defaults, and check them."""
    resolved = AgentConfig(
        server=server or os.environ.get("TRAINVITALS_SERVER") or DEFAULT_SERVER,
        project=project or os.environ.get("TRAINVITALS_PROJECT") or DEFAULT_PROJECT,
        run_name=run_name or generate_run_name(),
        token=token or os.environ.get("TRAINVITALS_TOKEN") or None,
        config=dict(config or {}),
        flush_interval=flush_interval,
        heartbeat_interval=_positive_env("TRAINVITALS_HEARTBEAT_INTERVAL", 5.0),
        stall_factor=_positive_env("TRAINVITALS_STALL_FACTOR", 10.0),
        stall_floor=_positive_env("TRAINVITALS_STALL_FLOOR", 30.0),
    )
    resolved.ingest_url  # noqa: B018 - validates the URL now, not in the sender thread
    if flush_interval <= 0:
        raise ConfigurationError(f"flush_interval must be > 0 seconds, got {flush_interval!r}")
    return resolved
