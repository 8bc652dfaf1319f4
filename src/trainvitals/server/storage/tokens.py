"""Access tokens and browser sessions.

A token is ``tv_<id>_<secret>``: the id finds its row, the secret is what proves it. Only a
SHA-256 of the whole token is stored (the secret is 256 random bits, so a slow hash would add
nothing), compared in constant time. A token grants one role (:class:`Role`) on one project,
or on every project (``*``). Browsers trade a token once for a session (an HttpOnly cookie);
a session lives as long as its token is not revoked and it has not expired.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import math
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from sqlalchemy import (
    Engine,
    RowMapping,
    Select,
    and_,
    case,
    delete,
    func,
    or_,
    select,
    update,
)

from trainvitals.exceptions import ConfigurationError
from trainvitals.server.storage.schema import sessions, tokens

ALL_PROJECTS = "*"
_PREFIX = "tv_"
#: Seconds within which a token's use is not written again: a use costs a write a minute at
#: most, not one a request.
USE_RESOLUTION = 60.0

log = logging.getLogger(__name__)


#: Browser sessions one token may hold at once; signing in again signs out the oldest.
MAX_SESSIONS_PER_TOKEN = 50


#: Which tokens a list holds: the revoked ones too, the live ones only, or the revoked only.
Revoked = Literal["include", "hide", "only"]
#: A token list's order: as made, the newest made first, or the latest revoked first.
Order = Literal["made", "newest", "revoked"]


class TokenCount(NamedTuple):
    live: int
    revoked: int
    #: Revoked, and presented whole after it (refused): a leak, or an agent forgotten.
    tried_after_revoke: int


def _which(query: Select[Any], project: str | None, revoked: Revoked) -> Select[Any]:
    if project is not None:
        query = query.where(tokens.c.project == project)
    if revoked == "hide":
        query = query.where(tokens.c.revoked_at.is_(None))
    elif revoked == "only":
        query = query.where(tokens.c.revoked_at.is_not(None))
    return query


class Role(enum.StrEnum):
    """What a token may do. ``admin`` may do everything ``read`` and ``ingest`` may."""

    #: Agents: stream runs of its project.
    INGEST = "ingest"
    #: The dashboard and the API: see runs and alerts of its project.
    READ = "read"
    #: Acknowledge and silence alerts, as well as read and ingest.
    ADMIN = "admin"
    #: Prometheus: scrape ``GET /metrics`` and nothing else (a token of every project).
    METRICS = "metrics"

    def allows(self, needed: Role) -> bool:
        # Reading sees more than the metrics show, so a reader may scrape too.
        return (
            self is needed or self is Role.ADMIN or (needed is Role.METRICS and self is Role.READ)
        )


@dataclass(frozen=True)
class Principal:
    """Who a request speaks for: a token's id, name, project and role."""

    token_id: str
    name: str
    project: str
    role: Role

    def may(self, role: Role, project: str | None = None) -> bool:
        """Whether this principal has ``role`` on ``project`` (on some project when None)."""
        if not self.role.allows(role):
            return False
        return project is None or self.project in (ALL_PROJECTS, project)

    @property
    def projects(self) -> str | None:
        """The one project it sees, or None for every project."""
        return None if self.project == ALL_PROJECTS else self.project


@dataclass(frozen=True)
class TokenInfo:
    """A token as ``trainvitals token list`` shows it: never the secret."""

    id: str
    name: str
    project: str
    role: Role
    created_at: float
    revoked_at: float | None
    #: When it was last used, to a minute; None: never (or not since revision 0009).
    last_used_at: float | None = None


def token_id_of(token: str) -> str:
    """The id part of ``tv_<id>_<secret>``."""
    return token[len(_PREFIX) :].split("_", 1)[0]


def _info(row: RowMapping) -> TokenInfo:
    return TokenInfo(
        row["id"], row["name"], row["project"], Role(row["role"]), row["created_at"],
        row["revoked_at"], row["last_used_at"],
    )  # fmt: skip


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class UseNotes:
    """Each token's last use, written off the requests' path: by one thread of its own, at most
    once a minute a token whatever came of the last try (a request never waits for the
    database's lock, nor do a busy token's requests try again one after the other)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._tried: dict[str, float] = {}  # token id -> when its use was last queued
        self._queue: queue.SimpleQueue[tuple[str, float] | None] = queue.SimpleQueue()
        self._pending = 0  # queued and not yet written (see ``wait``)
        self._done = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False

    def note(self, token_id: str, now: float | None = None, written: float | None = None) -> None:
        """A use of the token at ``now``; ``written``: the last use stored, when known."""
        now = time.time() if now is None else now
        with self._lock:
            last = max(self._tried.get(token_id, -math.inf), written or -math.inf)
            if self._closed or now - last < USE_RESOLUTION:
                return
            self._tried[token_id] = now
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="trainvitals-token-uses", daemon=True
                )
                self._thread.start()
            self._queue.put((token_id, now))  # under the lock: never behind close()'s end

    def wait(self, timeout: float = 10.0) -> bool:
        """Until every use noted so far is written (or failed); False on timeout."""
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """Writes what was noted before, then stops; later notes are dropped."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            token_id, now = item
            stale = or_(
                tokens.c.last_used_at.is_(None), tokens.c.last_used_at <= now - USE_RESOLUTION
            )
            try:
                with self._engine.begin() as conn:
                    conn.execute(
                        update(tokens)
                        .where(tokens.c.id == token_id, stale)
                        .values(last_used_at=now)
                    )
            except Exception as exc:  # whatever it was, the thread goes on to the next note
                log.info(
                    "trainvitals: could not note token %s's use: %s", token_id, type(exc).__name__
                )
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()


class TokenStore:
    """Tokens and sessions, on their own short transactions (they are not the writer's)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.uses = UseNotes(engine)

    def create(self, name: str, project: str, role: str, now: float | None = None) -> str:
        """A new token; returns it, the only time its secret is known."""
        try:
            granted = Role(role)
        except ValueError:
            roles = ", ".join(r.value for r in Role)
            raise ConfigurationError(f"Expected a role among {roles}, but got {role!r}") from None
        if not name or not project:
            raise ConfigurationError("A token needs a name and a project (or '*' for all)")
        if granted is Role.METRICS and project != ALL_PROJECTS:
            raise ConfigurationError(
                f"The metrics role covers every project: expected project '*', got {project!r}"
            )
        token_id = secrets.token_hex(6)
        token = f"{_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        with self._engine.begin() as conn:
            conn.execute(
                tokens.insert().values(
                    id=token_id,
                    name=name[:200],
                    project=project[:200],
                    role=granted.value,
                    hash=_digest(token),
                    created_at=time.time() if now is None else now,
                )
            )
        return token

    def list(
        self,
        project: str | None = None,
        *,
        revoked: Revoked = "include",
        limit: int | None = None,
        offset: int = 0,
        order: Order = "made",
    ) -> list[TokenInfo]:
        """The tokens in ``order``: as they were made, the newest made first (``newest``), or
        the latest revoked first, then the live ones, newest first (``revoked``); of
        ``project`` only when given; ``revoked``: with the revoked ones (``include``), without
        them (``hide``), or those only (``only``); at most ``limit`` from ``offset``."""
        made = tokens.c.created_at
        keys: dict[str, list[Any]] = {
            "made": [made],
            "newest": [made.desc()],
            "revoked": [tokens.c.revoked_at.desc().nulls_last(), made.desc()],
        }
        query = _which(select(tokens), project, revoked).order_by(*keys[order], tokens.c.id)
        query = query.limit(limit).offset(offset or None)
        with self._engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [_info(r) for r in rows]

    def count(self, project: str | None = None) -> TokenCount:
        """How many tokens (of ``project`` when given) are live, revoked, and revoked and
        tried after it (a use noted after the revocation)."""
        revoked_at, used = tokens.c.revoked_at, tokens.c.last_used_at
        query = select(
            func.count(),
            func.count(revoked_at),
            func.coalesce(func.sum(case((and_(revoked_at.is_not(None), used > revoked_at), 1))), 0),
        )
        with self._engine.connect() as conn:
            total, revoked, tried = conn.execute(_which(query, project, "include")).one()
        return TokenCount(int(total) - int(revoked), int(revoked), int(tried))

    def get(self, token_id: str) -> TokenInfo | None:
        with self._engine.connect() as conn:
            row = conn.execute(select(tokens).where(tokens.c.id == token_id)).mappings().first()
        return None if row is None else _info(row)

    def revoke(
        self, token_id: str, now: float | None = None, *, keep_last_admin: bool = False
    ) -> bool:
        """Revoke a token and end its sessions; False when there is no such live token, or
        when ``keep_last_admin`` and it is the last live admin token of every project."""
        live = tokens.c.revoked_at.is_(None)
        target = and_(tokens.c.id == token_id, live)
        with self._engine.begin() as conn:
            if keep_last_admin:
                admins = and_(
                    tokens.c.project == ALL_PROJECTS, tokens.c.role == Role.ADMIN.value, live
                )
                # PostgreSQL: one such revoke at a time, so that two cannot each leave the
                # other as the last (SQLite: the update below is one writer's statement).
                conn.execute(
                    select(tokens.c.id).where(admins).order_by(tokens.c.id).with_for_update()
                )
                others = (
                    select(func.count())
                    .select_from(tokens)
                    .where(admins, tokens.c.id != token_id)
                    .scalar_subquery()
                )
                target = and_(
                    target,
                    or_(
                        tokens.c.project != ALL_PROJECTS,
                        tokens.c.role != Role.ADMIN.value,
                        others > 0,
                    ),
                )
            done = conn.execute(
                update(tokens).where(target).values(revoked_at=time.time() if now is None else now)
            ).rowcount
            if done:
                conn.execute(delete(sessions).where(sessions.c.token_id == token_id))
        return bool(done)

    def live_count(self, project: str | None = None, role: Role | None = None) -> int:
        """How many tokens are not revoked (of ``project``, with ``role``, when given)."""
        query = select(func.count()).select_from(tokens).where(tokens.c.revoked_at.is_(None))
        if project is not None:
            query = query.where(tokens.c.project == project)
        if role is not None:
            query = query.where(tokens.c.role == role.value)
        with self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def made_since(self, project: str, since: float) -> int:
        """How many tokens of ``project`` were made at or after ``since``, revoked ones too."""
        query = (
            select(func.count())
            .select_from(tokens)
            .where(tokens.c.project == project, tokens.c.created_at >= since)
        )
        with self._engine.connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def verify(self, token: str, now: float | None = None) -> Principal | None:
        """Who ``token`` speaks for, or None when it is unknown, wrong or revoked (a use of
        it, at ``now``). A revoked token presented whole is refused and its attempt noted as
        its last use: one used after its revocation is a leak, or an agent forgotten, to find."""
        if not token.startswith(_PREFIX) or len(token) > 200:
            return None
        query = select(tokens).where(tokens.c.id == token_id_of(token))
        with self._engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        if row is None or not hmac.compare_digest(row["hash"], _digest(token)):
            return None
        if row["revoked_at"] is not None:
            self.uses.note(row["id"], now, row["last_used_at"])
            return None
        return self._used(row, now)

    def _used(self, row: RowMapping, now: float | None) -> Principal:
        """The principal of a token row just proven, its use noted (see :class:`UseNotes`)."""
        self.uses.note(row["id"], now, row["last_used_at"])
        return Principal(row["id"], row["name"], row["project"], Role(row["role"]))

    def open_session(self, principal: Principal, ttl: float, now: float | None = None) -> str:
        """A session for a signed-in browser; returns the cookie's value."""
        secret = secrets.token_urlsafe(32)
        now = time.time() if now is None else now
        with self._engine.begin() as conn:
            conn.execute(delete(sessions).where(sessions.c.expires_at < now))
            conn.execute(
                sessions.insert().values(
                    hash=_digest(secret), token_id=principal.token_id, expires_at=now + ttl
                )
            )
            # Each kept for days: signing in in a loop must not grow the table freely. The
            # oldest beyond the bound are signed out.
            newest = (
                select(sessions.c.hash)
                .where(sessions.c.token_id == principal.token_id)
                .order_by(sessions.c.expires_at.desc())
                .limit(MAX_SESSIONS_PER_TOKEN)
            )
            conn.execute(
                delete(sessions).where(
                    sessions.c.token_id == principal.token_id, sessions.c.hash.not_in(newest)
                )
            )
        return secret

    def session(self, secret: str, now: float | None = None) -> Principal | None:
        """Who a browser session speaks for (a use of its token), or None when it is unknown,
        expired, or its token revoked."""
        if not secret or len(secret) > 200:
            return None
        now = time.time() if now is None else now
        query = (
            select(tokens)
            .join(sessions, sessions.c.token_id == tokens.c.id)
            .where(
                sessions.c.hash == _digest(secret),
                sessions.c.expires_at >= now,
                tokens.c.revoked_at.is_(None),
            )
        )
        with self._engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            return None
        return self._used(row, now)

    def close_session(self, secret: str) -> None:
        with self._engine.begin() as conn:
            conn.execute(delete(sessions).where(sessions.c.hash == _digest(secret)))
