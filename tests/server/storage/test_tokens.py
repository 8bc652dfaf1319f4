"""Tokens in storage: revoking keeps the last admin token of every project when asked to, on
SQLite and PostgreSQL, and two revokes at once cannot each leave the other as the last."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text, update

from harness.polling import wait_for
from trainvitals.server.storage.schema import sessions, tokens
from trainvitals.server.storage.tokens import (
    ALL_PROJECTS,
    MAX_SESSIONS_PER_TOKEN,
    Role,
    UseNotes,
    token_id_of,
)
from trainvitals.server.store import Store


def test_the_last_admin_token_of_every_project_is_kept_when_asked(store: Store) -> None:
    a, b = (store.tokens.create(name, "*", "admin") for name in ("a", "b"))
    lead_p = store.tokens.create("lead-p", "p", "admin")
    reader = store.tokens.create("reader", "*", "read")
    for token in (lead_p, reader, a):  # none of them the last admin of every project
        assert store.tokens.revoke(token_id_of(token), keep_last_admin=True)
    assert not store.tokens.revoke(token_id_of(b), keep_last_admin=True)
    assert store.tokens.verify(b) is not None
    assert store.tokens.live_count(ALL_PROJECTS, Role.ADMIN) == 1
    assert store.tokens.revoke(token_id_of(b))  # `trainvitals token revoke` may: it has a shell
    assert store.tokens.verify(b) is None


def test_two_revokes_at_once_cannot_each_leave_the_other_last(postgres_url: str) -> None:
    """On PostgreSQL, each revoke's count of the other admins would see the other's row as
    live until it commits; the second waits for the first's lock instead, then counts."""
    store = Store(postgres_url)
    store.create_schema()
    try:
        a, b = (token_id_of(store.tokens.create(n, "*", "admin")) for n in ("a", "b"))
        admins = (tokens.c.project == ALL_PROJECTS) & (tokens.c.role == "admin")
        result: list[bool] = []
        with store.engine.connect() as first:
            # The first revoke, as the store makes it, held open before its commit.
            first.execute(
                select(tokens.c.id).where(admins, tokens.c.revoked_at.is_(None)).with_for_update()
            )
            first.execute(update(tokens).where(tokens.c.id == a).values(revoked_at=1.0))
            second = threading.Thread(
                target=lambda: result.append(store.tokens.revoke(b, keep_last_admin=True))
            )
            second.start()
            with store.engine.connect() as watcher:
                waiting = text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )

                def second_waits() -> bool:
                    try:  # a transaction sees one snapshot of pg_stat_activity: a new one each
                        return bool(watcher.execute(waiting).scalar())
                    finally:
                        watcher.rollback()

                wait_for(second_waits, what="the second revoke waiting for the first")
            first.commit()
        second.join(timeout=30)
        assert result == [False]
        assert store.tokens.live_count(ALL_PROJECTS, Role.ADMIN) == 1
    finally:
        store.dispose()


def test_a_tokens_use_is_noted_at_most_once_a_minute(store: Store) -> None:
    """A token's last use, by itself or by a session made from it, is written when the one
    written is a minute old: a write a minute at most, never one a request."""
    token = store.tokens.create("agents", "p", "ingest", now=100.0)
    token_id = token_id_of(token)

    def last_used() -> float | None:
        assert store.tokens.uses.wait()
        info = store.tokens.get(token_id)
        assert info is not None
        return info.last_used_at

    assert last_used() is None
    assert store.tokens.verify(token, now=1000.0) is not None
    assert last_used() == 1000.0
    assert store.tokens.verify(token, now=1059.0) is not None
    assert last_used() == 1000.0  # within the minute: not written again
    assert store.tokens.verify(token, now=1060.0) is not None
    assert last_used() == 1060.0
    principal = store.tokens.verify(token, now=1061.0)
    assert principal is not None
    cookie = store.tokens.open_session(principal, ttl=3600.0, now=1061.0)
    assert store.tokens.session(cookie, now=1200.0) is not None
    assert last_used() == 1200.0
    assert store.tokens.verify(token + "x", now=2000.0) is None  # a wrong one is no use of it
    assert last_used() == 1200.0
    store.tokens.uses.note(token_id, now=1300.0)  # a websocket's frames say so too
    assert last_used() == 1300.0


def test_a_revoked_tokens_attempt_is_refused_and_noted_as_its_last_use(store: Store) -> None:
    """Presented whole after its revocation: refused, and the attempt is its last use (a leak,
    or an agent still holding it, that an admin sees); a wrong secret is no attempt of it."""
    token = store.tokens.create("agents", "p", "ingest", now=100.0)
    token_id = token_id_of(token)
    assert store.tokens.revoke(token_id, now=200.0)
    assert store.tokens.verify(token, now=300.0) is None
    assert store.tokens.uses.wait()
    info = store.tokens.get(token_id)
    assert info is not None and (info.revoked_at, info.last_used_at) == (200.0, 300.0)
    assert store.tokens.verify(token[:-1] + ("A" if token[-1] != "A" else "B"), now=400.0) is None
    assert store.tokens.uses.wait()
    info = store.tokens.get(token_id)
    assert info is not None and info.last_used_at == 300.0


class FailsOnce:
    """An engine whose first transaction fails with an error of no database's."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.failed = engine, False

    def begin(self) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("not a database error")
        return self.engine.begin()


def test_the_use_notes_go_on_after_any_failed_write_and_stop_at_close(store: Store) -> None:
    token_id = token_id_of(store.tokens.create("agents", "p", "ingest", now=100.0))
    notes = UseNotes(FailsOnce(store.engine))  # type: ignore[arg-type]

    def last_used() -> float | None:
        assert notes.wait(timeout=10)
        info = store.tokens.get(token_id)
        assert info is not None
        return info.last_used_at

    notes.note(token_id, now=1000.0)
    assert last_used() is None  # failed, and counted done: wait() does not hang
    notes.note(token_id, now=1100.0)
    assert last_used() == 1100.0  # the thread lived on
    notes.note(token_id, now=1200.0)
    notes.close()  # writes what was noted before it...
    assert last_used() == 1200.0
    notes.note(token_id, now=1300.0)  # ...and nothing after
    assert last_used() == 1200.0


def test_a_database_busy_with_a_write_never_holds_a_request_for_a_tokens_use(
    tmp_path: Path,
) -> None:
    """The use is written by a thread of its own: while another process holds SQLite's write
    lock, the token is proven at once, and its use is written once the lock is free."""
    db = tmp_path / "team.db"
    store = Store(str(db))
    store.create_schema()
    try:
        token = store.tokens.create("agents", "p", "ingest", now=100.0)
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # the write lock, as a long writer holds it
        try:
            assert store.tokens.verify(token, now=1000.0) is not None
            info = store.tokens.get(token_id_of(token))
            assert info is not None and info.last_used_at is None  # queued, not written
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.tokens.uses.wait()
        info = store.tokens.get(token_id_of(token))
        assert info is not None and info.last_used_at == 1000.0
    finally:
        store.dispose()


def test_tokens_are_listed_live_or_revoked_a_page_at_a_time_and_counted(store: Store) -> None:
    projects = ["p" if i % 3 else "q" for i in range(9)]
    made = [store.tokens.create(f"t{i}", p, "read", now=100.0 + i) for i, p in enumerate(projects)]
    for i in (1, 2, 4, 8):  # p's t1, t2, t4, t8 revoked; t4 presented after it
        assert store.tokens.revoke(token_id_of(made[i]), now=200.0 + i)
    with store.engine.begin() as conn:
        conn.execute(update(tokens).where(tokens.c.name == "t4").values(last_used_at=300.0))
        conn.execute(update(tokens).where(tokens.c.name == "t5").values(last_used_at=300.0))

    def names(**how: Any) -> list[str]:
        return [info.name for info in store.tokens.list("p", **how)]

    assert names() == ["t1", "t2", "t4", "t5", "t7", "t8"]
    assert names(revoked="hide") == ["t5", "t7"]
    assert names(revoked="only", order="newest") == ["t8", "t4", "t2", "t1"]
    assert names(revoked="only", order="newest", limit=2, offset=1) == ["t4", "t2"]
    assert names(limit=2, offset=5) == ["t8"]
    assert store.tokens.count("p") == (2, 4, 1)  # t5's use is not after a revocation
    assert store.tokens.count(None) == (5, 4, 1)
    assert store.tokens.count("nobody") == (0, 0, 0)
    # The latest revoked first, whenever they were made; then the live ones, newest first.
    assert store.tokens.revoke(token_id_of(made[5]), now=250.0)  # t5: made before t8
    assert names(revoked="only", order="revoked") == ["t5", "t8", "t4", "t2", "t1"]
    assert names(order="revoked") == ["t5", "t8", "t4", "t2", "t1", "t7"]
    assert names(order="revoked", revoked="hide") == ["t7"]


def test_a_token_holds_a_bounded_number_of_sessions(store: Store) -> None:
    """Signing in in a loop (985 sessions in 5 s, each kept 7 days) must not grow the table:
    past the bound the oldest are signed out, the newest kept."""
    token = store.tokens.create("viewer", "p", "read", now=1.0)
    principal = store.tokens.verify(token, now=2.0)
    assert principal is not None
    cookies = [
        store.tokens.open_session(principal, ttl=3600.0, now=10.0 + i)
        for i in range(MAX_SESSIONS_PER_TOKEN + 5)
    ]
    with store.engine.connect() as conn:
        held = conn.execute(select(func.count()).select_from(sessions)).scalar_one()
    assert held == MAX_SESSIONS_PER_TOKEN
    assert all(store.tokens.session(c, now=100.0) is None for c in cookies[:5])
    assert all(store.tokens.session(c, now=100.0) is not None for c in cookies[5:])
