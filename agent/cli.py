"""The ``trainvitals`` command: ``serve`` runs the server, ``demo`` a real training run,
``notify-test`` checks a notification channel."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence

from trainvitals import __version__
from trainvitals.config import DEFAULT_SERVER

SERVER_EXTRA_HINT = "this command needs the server extra: pip install 'trainvitals[server]'"

#: ``demo --scenario`` choices (trainvitals.scenarios has the runs; importing it loads Keras).
SCENARIO_NAMES = {
    "healthy": "a CNN that learns; no alert",
    "nan-input": "a NaN pixel in one batch (nonfinite)",
    "explode": "a learning-rate warm-up that never stops (grad_explosion)",
    "diverge": "a learning-rate decay with its sign flipped (loss_divergence)",
    "leak": "a host-memory leak toward the limit (oom_forecast)",
    "hang": "the input generator blocks (stall)",
    "vanishing": "a deep sigmoid network (grad_vanishing)",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trainvitals",
        description="Live training-health monitor for TensorFlow/Keras.",
    )
    parser.add_argument("--version", action="version", version=f"trainvitals {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the server and dashboard",
        description="Run the trainvitals server: agent ingest, REST API and the dashboard.",
    )
    serve.add_argument("--host", default=None, help="interface to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        default=None,
        help="port (default 8600; 0 picks a free one and prints it)",
    )
    serve.add_argument(
        "--db",
        default=None,
        help="SQLite file path, sqlite:///path or "
        "postgresql://user@host/db (default ./trainvitals.db)",
    )
    serve.add_argument(
        "--rules",
        default=None,
        help="alert rules file (TOML): thresholds per rule and per project; see docs/alerts.md",
    )
    serve.add_argument(
        "--notify",
        default=None,
        metavar="FILE",
        help="notification channels file (TOML): Slack and webhooks, routing and pace; "
        "see docs/notifications.md",
    )
    serve.add_argument(
        "--public-url",
        default=None,
        metavar="URL",
        help="the dashboard's address as people reach it, for links in notifications",
    )

    notify_test = commands.add_parser(
        "notify-test",
        help="send a test message to a notification channel",
        description="Send a test message to one channel of the channels file and say whether "
        "its receiver accepted it (exit 0) or not (exit 1).",
    )
    notify_test.add_argument("--channel", required=True, metavar="NAME", help="the channel's name")
    notify_test.add_argument(
        "--notify",
        default=None,
        metavar="FILE",
        help="channels file (default $TRAINVITALS_NOTIFY)",
    )
    notify_test.add_argument(
        "--public-url", default=None, metavar="URL", help="server address named in the message"
    )

    demo = commands.add_parser(
        "demo",
        help="train a small real Keras model that streams to a server",
        description="Train a small CNN on scikit-learn's bundled digits, streaming to a server.",
    )
    demo.add_argument("--server", default=None, help=f"server URL (default {DEFAULT_SERVER})")
    demo.add_argument(
        "--scenario",
        default="healthy",
        choices=list(SCENARIO_NAMES),
        help="what goes wrong in the run, to show its alert: "
        + "; ".join(f"{name}: {summary}" for name, summary in SCENARIO_NAMES.items())
        + " (default healthy)",
    )
    demo.add_argument("--project", default="demo", help="project name (default demo)")
    demo.add_argument("--run-name", default=None, help="run name (default generated)")
    demo.add_argument("--epochs", type=int, default=30, help="epochs (default 30)")
    demo.add_argument(
        "--pace",
        type=float,
        default=0.02,
        help="seconds to pause after each step so people can watch it draw "
        "(default 0.02; 0 trains at full speed)",
    )
    demo.add_argument(
        "--time-to-oom",
        type=float,
        default=180.0,
        help="leak: seconds the leak would take to reach the memory limit (default 180)",
    )
    demo.add_argument(
        "--hang-for",
        type=float,
        default=90.0,
        help="hang: seconds the input generator blocks (default 90)",
    )

    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "notify-test":
        return _notify_test(args)
    return _demo(args)


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
        from trainvitals.server import Settings, create_app
        from trainvitals.server.storage import StorageError, database_url
    except ImportError as exc:
        print(f"trainvitals serve: {SERVER_EXTRA_HINT} ({exc})", file=sys.stderr)
        return 2
    from trainvitals.detect import RulesError, load_rules
    from trainvitals.server.notify import NotifyError, load_notify

    overrides = {
        "host": args.host,
        "port": args.port,
        "db": args.db,
        "rules": args.rules,
        "notify": args.notify,
        "public_url": args.public_url,
    }
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    try:
        database_url(settings.db)
        if settings.rules:
            load_rules(settings.rules)
        if settings.notify:
            load_notify(settings.notify)
    except (StorageError, RulesError, NotifyError) as exc:
        print(f"trainvitals serve: {exc}", file=sys.stderr)
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
        f"trainvitals {__version__} serving on http://{settings.host}:{port}/ (db: {settings.db})",
        flush=True,
    )
    config = uvicorn.Config(
        create_app(settings),
        ws_max_size=2 * settings.max_frame_bytes,  # oversized frames get our 1009 with a reason
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _notify_test(args: argparse.Namespace) -> int:
    try:
        import asyncio

        from trainvitals.server import Settings
        from trainvitals.server.notify import NotifyError, load_notify
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


def _demo(args: argparse.Namespace) -> int:
    try:
        from trainvitals.demo import run_demo
    except ImportError as exc:
        print(
            f"trainvitals demo needs TensorFlow and scikit-learn: "
            f"pip install tensorflow 'trainvitals[demo]' ({exc})",
            file=sys.stderr,
        )
        return 2
    run_demo(
        server=args.server,
        scenario=args.scenario,
        project=args.project,
        run_name=args.run_name,
        epochs=args.epochs,
        pace=args.pace,
        time_to_oom=args.time_to_oom,
        hang_for=args.hang_for,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
