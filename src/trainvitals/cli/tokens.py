"""``trainvitals token create|list|revoke``: the access tokens of a server's database."""

from __future__ import annotations

import argparse
import os
import sys

from trainvitals.cli.formatting import when
from trainvitals.cli.server import SERVER_EXTRA_HINT


def token_command(args: argparse.Namespace) -> int:
    try:
        from trainvitals.exceptions import ConfigurationError
        from trainvitals.server import Settings
        from trainvitals.server.store import Store
    except ImportError as exc:
        print(f"trainvitals token: {SERVER_EXTRA_HINT} ({exc})", file=sys.stderr)
        return 2
    settings = Settings(**({"db": args.db} if args.db else {}))
    # Only `create` may make the database: listing or revoking in a mistyped path would
    # otherwise leave an empty database there and answer as if it had no tokens.
    absent = None if args.token_command == "create" else _absent_sqlite_file(settings.db)
    if absent is not None:
        print(
            f"trainvitals token: no database at {absent}; name the server's with --db or "
            "$TRAINVITALS_DB (trainvitals serve and trainvitals token create make one)",
            file=sys.stderr,
        )
        return 1
    try:
        store = Store(settings.db)
    except ConfigurationError as exc:
        print(f"trainvitals token: {exc}", file=sys.stderr)
        return 2
    try:
        store.create_schema()
        if args.token_command == "create":
            name = args.name or f"{args.role}@{args.project}"
            token = store.tokens.create(name, args.project, args.role)
            print(token)
            print(
                f"(token {name!r}: {args.role} on {args.project}; it is shown only now)",
                file=sys.stderr,
            )
            return 0
        if args.token_command == "list":
            print(
                f"{'id':<14}{'role':<8}{'project':<20}{'created':<22}{'revoked':<22}"
                f"{'last used':<22}name"
            )
            tried = 0  # revoked tokens presented after their revocation
            for t in store.tokens.list():
                created, revoked, used = (
                    when(t.created_at), when(t.revoked_at), when(t.last_used_at)
                )  # fmt: skip
                if t.revoked_at is not None and (t.last_used_at or 0) > t.revoked_at:
                    used, tried = f"{used} !", tried + 1
                print(
                    f"{t.id:<14}{t.role:<8}{t.project:<20}{created:<22}{revoked:<22}{used:<22}"
                    f"{t.name}"
                )
            if tried:
                print(
                    f"(!: {tried} revoked token(s) presented after the revocation, and refused:"
                    " a leak, or an agent still holding it)",
                    file=sys.stderr,
                )
            return 0
        if store.tokens.revoke(args.id):
            print(f"revoked {args.id}")
            return 0
        print(f"trainvitals token: no live token with id {args.id!r}", file=sys.stderr)
        return 1
    except ConfigurationError as exc:
        print(f"trainvitals token: {exc}", file=sys.stderr)
        return 2
    finally:
        store.dispose()


def _absent_sqlite_file(db: str) -> str | None:
    """The path of the SQLite file ``db`` names when there is no such file; else None (a
    file that exists, a PostgreSQL URL, an in-memory database, a URL the store will refuse)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from trainvitals.server.storage import database_url

    try:
        url = make_url(database_url(db))
    except (ValueError, ArgumentError):
        return None  # the store says what is wrong with it
    path = url.database
    if url.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if os.path.exists(path) else path
