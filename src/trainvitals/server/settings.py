"""Server settings: command-line flags override ``TRAINVITALS_*`` environment variables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from trainvitals.exceptions import ConfigurationError
from trainvitals.protocol import MAX_FRAME_BYTES


class Settings(BaseSettings):
    """Everything the server can be told. Environment: ``TRAINVITALS_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="TRAINVITALS_")

    #: SQLite file path, ``sqlite:///path``, or ``postgresql://user@host/db``.
    db: str = "trainvitals.db"
    host: str = "127.0.0.1"
    port: int = 8600
    #: Largest agent frame accepted; larger ones close the connection with 1009.
    max_frame_bytes: int = MAX_FRAME_BYTES
    #: ``required``: every route but ``/healthz`` and both websockets need a token (``trainvitals
    #: token create``). ``off``: anyone who reaches the port may do anything, allowed on a
    #: loopback address only. Unset: ``off`` on a loopback address, else ``required``.
    auth: Literal["required", "off"] | None = None
    #: Seconds an agent's connection may wait before its ``hello``.
    hello_timeout: float = 10.0
    #: Per token: ingest connections open at once (beyond: close 1013).
    max_connections: int = 1000
    #: Websockets (agents' and browsers') open at once on this process, every token together:
    #: beyond, the upgrade is answered 503. Each may hold one frame of up to twice
    #: ``max_frame_bytes`` while it is read (docs/security.md#limits).
    max_websockets: int = 4000
    #: Seconds a write that fails on the database (down, full, locked) is tried again before
    #: it is refused and agents are told to come back later (close 1013); ``/healthz``
    #: answers 503 from the first failure (docs/operations.md#storage-outages).
    storage_patience: float = 5.0
    #: Seconds a stopping server (SIGTERM) waits for its open connections before it closes
    #: them; it then ends whatever state its database is in.
    shutdown_grace: int = 5
    #: Exports streaming at once on this process (beyond: 503 with Retry-After): each reads a
    #: run's every point, and five at once tripled ``/healthz``'s p99.
    max_exports: int = 2
    #: Per token: new runs in any minute (beyond: close 1013).
    max_runs_per_minute: int = 600
    #: Series one run may hold (beyond: close 1008).
    max_series_per_run: int = 2000
    #: Per token: bytes of agent frames a UTC day (beyond: close 1013).
    max_bytes_per_day: int = 50 * 2**30
    #: Bytes of live messages a browser may fall behind before it is disconnected (1013).
    live_queue_bytes: int = 64 * 2**20
    #: Seconds a browser's sign-in lasts.
    session_ttl: float = 7 * 86400.0
    #: Largest HTTP request body accepted; larger ones get 413 before anything reads them.
    max_body_bytes: int = 1 << 20
    #: Extra ``Host`` names the server answers to, comma-separated (``*``: any). By default a
    #: loopback server answers to loopback names only (no DNS rebinding), a server on one
    #: address to it and ``public_url``'s host, and one on every interface to any host unless
    #: ``public_url`` names it.
    allowed_hosts: str | None = None
    #: Seconds between pushes of run-list updates to browsers (run changes are coalesced).
    runs_push_interval: float = 0.5
    #: Messages a browser may fall behind before it is disconnected (1013) to protect ingest.
    live_queue_size: int = 2000
    #: Seconds without any frame (points or heartbeat) before a running run becomes ``lost``.
    lost_after: float = 30.0
    #: A rules file (TOML) with thresholds per rule and per project; see docs/alerts.md.
    rules: str | None = None
    #: A channels file (TOML): Slack and webhook destinations; see docs/notifications.md.
    notify: str | None = None
    #: The dashboard's address as people reach it (``https://tv.example.org``), for the links
    #: in notifications; without it they carry no link.
    public_url: str | None = None
    #: Seconds a server holds undelivered notifications without renewing its claim before
    #: another server (or this one, restarted after a kill) takes them over.
    notify_lease: float = 15.0
    #: Running runs whose latest vitals ``GET /metrics`` exports, newest first (each adds a
    #: few series to Prometheus; the rest are counted in ``trainvitals_run_vitals_omitted``).
    metrics_max_runs: int = 100
    #: Seconds between the compactor's sweeps, which rewrite stored frames as compact blocks
    #: (see docs/contract.md#storage); 0: never.
    compact_interval: float = 30.0
    #: Days after a run ends before its points are thinned to a min/max summary of at most
    #: ``thin_points`` a series: ``90`` for every project, ``90,scratch=7,golden=0`` with
    #: per-project days (0: never). Unset: never.
    thin_after_days: str | None = None
    #: Points a series keeps when thinned: each bucket's minimum and maximum, and its first
    #: NaN/Inf, so spikes survive.
    thin_points: Annotated[int, Field(ge=2, le=65_536)] = 10_000

    #: Days after a run is archived before it is deleted with everything of it (as
    #: ``DELETE /api/v1/runs/{id}`` does): ``30`` for every project, ``30,scratch=3,golden=0``
    #: with per-project days (0: never). Unset: never.
    delete_archived_after_days: str | None = None

    @field_validator("thin_after_days", "delete_archived_after_days")
    @classmethod
    def _readable_policy(cls, value: str | None) -> str | None:
        Retention.parse(value)
        return value

    @property
    def retention(self) -> Retention:
        """``thin_after_days``, read."""
        return Retention.parse(self.thin_after_days)

    @property
    def archived_retention(self) -> Retention:
        """``delete_archived_after_days``, read."""
        return Retention.parse(self.delete_archived_after_days)

    #: A Redis URL (``redis://host:6379/0``) through which replicas share live updates: a
    #: browser on any replica sees every run. Unset: live updates stay in this process.
    broker: str | None = None
    #: Seconds a replica holds a run's detector, the lost-run sweep or the deletion of archived
    #: runs without renewing its lease (a row in the database) before another replica may take
    #: it over.
    lease: float = 15.0

    @property
    def auth_required(self) -> bool:
        """Whether requests need a token (``auth``, or where the server listens)."""
        from trainvitals.server.guard import is_loopback

        return self.auth == "required" or (self.auth is None and not is_loopback(self.host))


@dataclass(frozen=True)
class Retention:
    """How many days after a moment of a run (its end, its archiving) something is done to
    it (its points thinned, the run deleted): ``default`` for every project (None: never) but
    those in ``projects`` (0: never)."""

    default: float | None = None
    projects: dict[str, float] = field(default_factory=dict)

    @property
    def applies(self) -> bool:
        """Whether the policy reaches any run."""
        return self.default is not None or any(days > 0 for days in self.projects.values())

    @classmethod
    def parse(cls, text: str | None) -> Retention:
        """``"90,scratch=7,golden=0"``: 90 days, 7 for project scratch, never for golden."""
        default: float | None = None
        projects: dict[str, float] = {}
        for part in filter(str.strip, (text or "").split(",")):
            name, _, days = part.strip().rpartition("=")
            try:
                value = float(days)
            except ValueError:
                value = -1.0
            if not value >= 0 or (not name and "=" in part):
                raise ConfigurationError(  # a ValueError: pydantic names the setting
                    f"Expected days like '90' or 'project=7', comma-separated, but got {part!r}"
                )
            if name:
                projects[name] = value
            else:
                default = value or None
        return cls(default, projects)
