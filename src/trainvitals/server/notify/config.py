"""The channels file: where alerts go, which ones, and how fast.

A channels file is TOML (``trainvitals serve --notify FILE`` or ``TRAINVITALS_NOTIFY``)::

    [defaults]                       # optional; every channel may override these
    min_severity = "warning"
    group_window = 2.0               # seconds: alerts this close are sent as one message
    rate = 1.0                       # messages per second, with bursts of `burst`
    burst = 3

    [[channels]]
    name = "ml-team"
    kind = "slack"                   # a Slack incoming webhook
    url_env = "SLACK_WEBHOOK_URL"    # the secret URL, read from this environment variable
    projects = ["mnist", "gan"]      # default: every project

    [[channels]]
    name = "pager"
    kind = "webhook"                 # JSON, signed with HMAC-SHA256
    url = "https://ops.example.org/hooks/trainvitals"
    secret = "${PAGER_HMAC_KEY}"     # ${NAME} is taken from the environment
    min_severity = "critical"

    [[channels]]
    name = "on-call"
    kind = "pagerduty"               # PagerDuty Events API v2: trigger, then resolve
    routing_key_env = "PD_ROUTING_KEY"

    [[channels]]
    name = "mail"
    kind = "email"                   # SMTP, STARTTLS unless starttls = false
    smtp_host = "smtp.example.org"
    username_env = "SMTP_USER"
    password_env = "SMTP_PASSWORD"
    from = "trainvitals@example.org"
    to = ["ml-team@example.org"]

Secret URLs and keys are held by :class:`Channel` out of its ``repr`` and out of
:meth:`Channel.describe`, which is all the API and the logs ever show.
``docs/notifications.md`` explains every setting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from typing_extensions import TypedDict  # pydantic reads these on 3.11

from trainvitals.detect.alert_book import Alert
from trainvitals.detect.settings import read_toml
from trainvitals.detect.types import SEVERITIES, Severity
from trainvitals.exceptions import NotifyError

Kind = Literal["slack", "webhook", "pagerduty", "email", "teams", "discord"]

#: PagerDuty's Events API v2 (the EU service account's is ``events.eu.pagerduty.com``).
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"

# Kinds whose URL is itself the secret: they take no signing key.
_SECRET_URL_KINDS = ("slack", "teams", "discord")
_SMTP_SETTINGS = (
    "smtp_host", "smtp_port", "starttls", "username_env", "password_env", "from_", "to",
)  # fmt: skip

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Pace(BaseModel):
    """How often one channel may be sent to (the settings a ``[defaults]`` table may set)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_severity: Severity = "warning"
    #: Alerts arriving within this many seconds of the channel's last message wait for the
    #: window to end and go out together as one grouped message.
    group_window: Annotated[float, Field(ge=0)] = 2.0
    #: Most alerts in one grouped message; more wait for the next one.
    group_max: Annotated[int, Field(ge=1, le=40)] = 20
    #: When a storm leaves more than ``group_max`` alerts waiting, one digest message takes up
    #: to this many of them (Slack: counts by rule and project, the first ``group_max`` lines).
    flood_max: Annotated[int, Field(ge=1, le=5000)] = 500
    #: Messages per second, with bursts of up to ``burst`` (a token bucket).
    rate: Annotated[float, Field(gt=0)] = 1.0
    burst: Annotated[int, Field(ge=1)] = 3
    #: Seconds one HTTP request may take before it counts as a network error.
    timeout: Annotated[float, Field(gt=0, le=60)] = 5.0
    #: Seconds after which an undeliverable notification is given up (marked failed).
    give_up_after: Annotated[float, Field(gt=0)] = 86_400.0


class _ChannelTable(_Pace):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")]
    kind: Kind
    url: str | None = None
    url_env: str | None = None
    secret: str | None = None
    secret_env: str | None = None
    projects: list[str] | None = None
    # pagerduty
    routing_key: str | None = None
    routing_key_env: str | None = None
    # email
    smtp_host: str | None = None
    smtp_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    starttls: bool | None = None  # an email channel's: on unless false
    username_env: str | None = None
    password_env: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: Annotated[list[str], Field(min_length=1, max_length=100)] | None = None

    @model_validator(mode="after")
    def _settings_of_its_kind(self) -> _ChannelTable:
        if self.secret is not None and self.secret_env is not None:
            raise ValueError("give at most one of secret and secret_env")
        if self.kind != "webhook" and (self.secret or self.secret_env):
            raise ValueError(f"a {self.kind} channel takes no secret (only webhooks are signed)")
        if self.kind != "pagerduty" and (self.routing_key or self.routing_key_env):
            raise ValueError("routing_key is a pagerduty channel's setting")
        if self.kind != "email":
            given = [name for name in _SMTP_SETTINGS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given[0].rstrip('_')} is an email channel's setting")
        if self.kind == "email":
            if self.url is not None or self.url_env is not None:
                raise ValueError("an email channel takes no url; give smtp_host")
            missing = [n for n in ("smtp_host", "from_", "to") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"an email channel needs {missing[0].rstrip('_')}")
            if (self.username_env is None) != (self.password_env is None):
                raise ValueError("give both username_env and password_env, or neither")
        elif self.kind == "pagerduty":
            if (self.routing_key is None) == (self.routing_key_env is None):
                raise ValueError("give exactly one of routing_key and routing_key_env")
            if self.url_env is not None:
                raise ValueError("a pagerduty channel takes url (the endpoint), not url_env")
        elif (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url and url_env")
        return self


@dataclass(frozen=True)
class Smtp:
    """Where an email channel sends, and as whom; ``password`` never shows."""

    host: str
    port: int
    starttls: bool
    sender: str
    recipients: tuple[str, ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)


class ChannelDescription(TypedDict):
    """A channel as the API and logs show it: no URL path, no secret."""

    name: str
    kind: str
    target: str
    signed: bool
    projects: list[str] | None
    min_severity: str
    group_window: float
    group_max: int
    flood_max: int
    rate: float
    burst: int


@dataclass(frozen=True)
class Channel:
    """One destination with its routing and pace; ``url`` and ``secret`` never show.

    ``secret`` is a webhook's HMAC key or PagerDuty's routing key; an email channel's ``url``
    is ``smtp://host:port``, its server and account in ``smtp``."""

    name: str
    kind: Kind
    url: str = field(repr=False)
    secret: bytes | None = field(default=None, repr=False)
    smtp: Smtp | None = None
    #: Projects routed here; None means every project.
    projects: frozenset[str] | None = None
    min_severity: Severity = "warning"
    group_window: float = 2.0
    group_max: int = 20
    flood_max: int = 500
    rate: float = 1.0
    burst: int = 3
    timeout: float = 5.0
    give_up_after: float = 86_400.0

    @property
    def groups(self) -> bool:
        """Whether alerts that wait together go out as one message. PagerDuty takes one event
        per alert: its ``dedup_key`` is what a later ``resolve`` names."""
        return self.kind != "pagerduty"

    def wants(self, alert: Alert) -> bool:
        """Whether ``alert`` is routed to this channel."""
        if self.projects is not None and alert.project not in self.projects:
            return False
        return SEVERITIES.index(alert.severity) >= SEVERITIES.index(self.min_severity)

    @property
    def target(self) -> str:
        """Scheme and host of the URL: enough to tell channels apart, nothing secret."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}"

    def describe(self) -> ChannelDescription:
        """The channel as the API and logs show it: no URL path, no secret."""
        return {
            "name": self.name,
            "kind": self.kind,
            "target": self.target,
            "signed": self.kind == "webhook" and self.secret is not None,
            "projects": sorted(self.projects) if self.projects is not None else None,
            "min_severity": self.min_severity,
            "group_window": self.group_window,
            "group_max": self.group_max,
            "flood_max": self.flood_max,
            "rate": self.rate,
            "burst": self.burst,
        }


@dataclass(frozen=True)
class NotifyConfig:
    """Every channel, in file order."""

    channels: tuple[Channel, ...] = ()

    def get(self, name: str) -> Channel:
        for channel in self.channels:
            if channel.name == name:
                return channel
        known = ", ".join(c.name for c in self.channels) or "none"
        raise NotifyError(f"No channel named {name!r}; the channels file has: {known}")

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> NotifyConfig:
        environ = os.environ if environ is None else environ
        unknown = set(data) - {"defaults", "channels"}
        if unknown:
            raise NotifyError(
                f"unknown table {sorted(unknown)[0]!r}; expected [defaults] and [[channels]]"
            )
        defaults = data.get("defaults", {})
        tables = data.get("channels", [])
        if not isinstance(defaults, Mapping):
            raise NotifyError("[defaults]: expected a table")
        if not isinstance(tables, list):
            raise NotifyError("channels: expected an array of tables, [[channels]]")
        _validated(_Pace, defaults, "[defaults]")
        channels = []
        for index, table in enumerate(tables):
            where = f"[[channels]] #{index + 1}"
            if isinstance(table, Mapping) and isinstance(table.get("name"), str):
                where += f" ({table['name']})"
            if not isinstance(table, Mapping):
                raise NotifyError(f"{where}: expected a table")
            spec = _validated(_ChannelTable, {**defaults, **table}, where)
            channels.append(_resolve(spec, environ, where))
        names = [c.name for c in channels]
        for name in names:
            if names.count(name) > 1:
                raise NotifyError(f"channel name {name!r} is used twice; names must be unique")
        return cls(tuple(channels))


def load_notify(path: str | Path, environ: Mapping[str, str] | None = None) -> NotifyConfig:
    """Read a channels file; a missing file, bad TOML, an unknown setting or an unset
    environment variable is a :class:`NotifyError`."""
    data = read_toml(path, "channels file", NotifyError)
    try:
        return NotifyConfig.from_mapping(data, environ)
    except NotifyError as exc:
        raise NotifyError(f"{path}: {exc}") from None


def _validated(model: type[_Pace], table: Mapping[str, Any], where: str) -> Any:
    try:
        return model.model_validate(table)
    except ValidationError as exc:
        error = exc.errors()[0]
        setting = ".".join(str(part) for part in error["loc"])
        # Never echo the input: it may be a secret URL or key.
        raise NotifyError(f"{where} {setting or 'table'}: {error['msg']}") from None


def _resolve(spec: _ChannelTable, environ: Mapping[str, str], where: str) -> Channel:
    smtp = None
    if spec.kind == "email":
        smtp = _smtp(spec, environ, where)
        url = f"smtp://{smtp.host}:{smtp.port}"
    elif spec.kind == "pagerduty" and spec.url is None:
        url = PAGERDUTY_URL
    else:
        given = _secret(spec.url, spec.url_env, environ, f"{where} url")
        assert given is not None  # one of url and url_env is given
        url = given
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise NotifyError(f"{where} url: expected an http:// or https:// URL")
    if spec.kind == "pagerduty":
        secret = _secret(spec.routing_key, spec.routing_key_env, environ, f"{where} routing_key")
    else:
        secret = _secret(spec.secret, spec.secret_env, environ, f"{where} secret")
    pace = spec.model_dump(include=set(_Pace.model_fields))
    return Channel(
        name=spec.name,
        kind=spec.kind,
        url=url,
        secret=secret.encode() if secret is not None else None,
        smtp=smtp,
        projects=frozenset(spec.projects) if spec.projects is not None else None,
        **pace,
    )


def _smtp(spec: _ChannelTable, environ: Mapping[str, str], where: str) -> Smtp:
    assert spec.smtp_host is not None and spec.from_ is not None and spec.to is not None
    starttls = spec.starttls is not False
    for address in (spec.from_, *spec.to):
        # One address each, no header injection: a newline would add headers to the mail.
        if "@" not in address or any(c in address for c in "\r\n,;<>"):
            raise NotifyError(f"{where} from/to: expected plain addresses (name@host)")
    username = _secret(None, spec.username_env, environ, f"{where} username")
    password = _secret(None, spec.password_env, environ, f"{where} password")
    return Smtp(
        host=spec.smtp_host,
        # 587 is the submission port, where STARTTLS is the norm; 25 for a plain relay.
        port=spec.smtp_port or (587 if starttls else 25),
        starttls=starttls,
        sender=spec.from_,
        recipients=tuple(spec.to),
        username=username,
        password=password,
    )


def _secret(
    value: str | None, env_name: str | None, environ: Mapping[str, str], where: str
) -> str | None:
    """``value`` with ``${NAME}`` references expanded, or the variable ``env_name``."""
    if env_name is not None:
        if not environ.get(env_name):
            raise NotifyError(f"{where}_env: the environment variable {env_name} is not set")
        return environ[env_name]
    if value is None:
        return None

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise NotifyError(f"{where}: the environment variable {name} is not set")
        return environ[name]

    return _ENV_REFERENCE.sub(expand, value)
