"""``trainvitals db upgrade``: bring a server's database to the current schema."""

from __future__ import annotations

import argparse
import sys

from trainvitals.cli.server import SERVER_EXTRA_HINT


def db_command(args: argparse.Namespace) -> int:
    try:
        from sqlalchemy.exc import DBAPIError

        from trainvitals.exceptions import ConfigurationError
        from trainvitals.server import Settings
        from trainvitals.server.migrations import head_revision
        from trainvitals.server.storage import shown_database
        from trainvitals.server.store import Store
    except ImportError as exc:
        print(f"trainvitals db: {SERVER_EXTRA_HINT} ({exc})", file=sys.stderr)
        return 2
    settings = Settings(**({"db": args.db} if args.db else {}))
    shown = shown_database(settings.db)
    try:
        store = Store(settings.db)
        try:
            revision = store.create_schema()
        finally:
            store.dispose()
    except ConfigurationError as exc:
        print(f"trainvitals db upgrade: {shown}: {exc}", file=sys.stderr)
        return 2
    except DBAPIError as exc:  # unreachable, refused, no such database: the driver's reason
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        print(f"trainvitals db upgrade: {shown}: {reason}", file=sys.stderr)
        return 1
    head = " (head)" if revision == head_revision() else ""
    print(f"{shown}: at revision {revision}{head}")
    return 0
