"""``trainvitals serve`` and ``trainvitals notify-test``: the commands that need the server
extra."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TYPE_CHECKING

from trainvitals import __version__

if TYPE_CHECKING:
    from trainvitals.server import Settings

SERVER_EXTRA_HINT = "this command needs the server extra: pip install 'trainvitals[server]'"


def serve_command(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from trainvitals.server import Settings, create_app
        from trainvitals.server.storage import database_url, shown_database
    except ImportError as exc:
        print(f"trainvitals serve: {SERVER_EXTRA_HINT} ({exc})", file=sys.stderr)
        return 2
    from trainvitals.detect import load_rules
    from trainvitals.exceptions import ConfigurationError
    from trainvitals.server.notify import load_notify

    overrides = {
        "host": args.host,
        "port": args.port,
        "db": args.db,
        "rules": args.rules,
        "notify": args.notify,
        "public_url": args.public_url,
        "auth": args.auth,
        "broker": args.broker,
    }
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    try:
        database_url(settings.db)
        if settings.rules:
            load_rules(settings.rules)
        if settings.notify:
            load_notify(settings.notify)
        if settings.broker:
            from trainvitals.server.broker import check_broker_url

            check_broker_url(settings.broker)
        refusal = _refusal(settings)
    except ConfigurationError as exc:
        print(f"trainvitals serve: {exc}", file=sys.stderr)
        return 2
    if refusal:
        print(f"trainvitals serve: {refusal}", file=sys.stderr)
        return 2
    # Bind first, so --port 0 can print the port it got before anyone needs it.
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        print(
            f"trainvitals serve: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    port = sock.getsockname()[1]
    print(
        f"trainvitals {__version__} serving on http://{settings.host}:{port}/ "
        f"(db: {shown_database(settings.db)}"
        + (f", broker: {shown_database(settings.broker)})" if settings.broker else ")"),
        flush=True,
    )
    config = uvicorn.Config(
        create_app(settings),
        ws_max_size=2 * settings.max_frame_bytes,  # oversized frames get our 1009 with a reason
        # Agents send uncompressed; inflating was a client's way to make the server hold
        # 8 MiB for 8 KB sent (docs/security.md#limits).
        ws_per_message_deflate=False,
        # SIGTERM ends the server within a bound even when connections wait on a database
        # that is down: they are closed after this grace.
        timeout_graceful_shutdown=settings.shutdown_grace,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def notify_test_command(args: argparse.Namespace) -> int:
    try:
        import asyncio

        from trainvitals.exceptions import NotifyError
        from trainvitals.server import Settings
        from trainvitals.server.notify import load_notify
        from trainvitals.server.notify.delivery import send_test
        from trainvitals.server.notify.messages import probe_message
    except ImportError as exc:
        print(f"trainvitals notify-test: {SERVER_EXTRA_HINT} ({exc})", file=sys.stderr)
        return 2
    overrides = {"notify": args.notify, "public_url": args.public_url}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    if not settings.notify:
        print(
            "trainvitals notify-test: no channels file: pass --notify FILE or set "
            "TRAINVITALS_NOTIFY",
            file=sys.stderr,
        )
        return 2
    try:
        channel = load_notify(settings.notify).get(args.channel)
    except NotifyError as exc:
        print(f"trainvitals notify-test: {exc}", file=sys.stderr)
        return 2
    outcome = asyncio.run(send_test(channel, probe_message(channel, settings.public_url)))
    where = f"channel {channel.name!r} ({channel.kind}, {channel.target})"
    if outcome.accepted:
        print(f"OK: {where} accepted the test message ({outcome.detail}).")
        return 0
    print(f"FAILED: {where} did not accept the test message: {outcome.detail}", file=sys.stderr)
    return 1


def _refusal(settings: Settings) -> str | None:
    """Why the server must not start as configured: open to the network, or asking for
    tokens nobody has. Migrates the database first: one this version can't use (a
    ``StorageError``) stops the command before it listens."""
    from trainvitals.server.guard import is_loopback
    from trainvitals.server.store import Store

    if settings.auth == "off" and not is_loopback(settings.host):
        return (
            f"--auth off is allowed on a loopback address only, not {settings.host}: create "
            "tokens (trainvitals token create) and serve with --auth required"
        )
    store = Store(settings.db)
    try:
        store.create_schema()
        if settings.auth_required and store.tokens.live_count() == 0:
            return (
                "auth is required but the database has no tokens: create one with "
                "trainvitals token create --db ... --project '*' --role admin"
            )
    finally:
        store.dispose()
    return None
