"""The ``trainvitals`` command: ``serve`` runs the server, ``demo`` a real training run,
``token`` manages access tokens, ``db upgrade`` migrates the database, ``notify-test`` checks
a notification channel, ``runs`` lists runs, ``export`` writes a run's series (or several
runs') to a file, ``sync`` delivers the frames ended processes left in their spools. Without a
command it prints its help.

This module only builds the parser; each command lives beside it (:mod:`.server`,
:mod:`.demo`) and imports what it needs when it runs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trainvitals import __version__
from trainvitals.agent.config import DEFAULT_SERVER

#: ``demo --scenario`` choices (trainvitals.demo.scenarios has the runs; importing it loads Keras).
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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

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
        "--broker",
        default=None,
        metavar="URL",
        help="redis://host:6379/0: share live updates with the other replicas behind a load "
        "balancer (default: none, live updates stay in this process)",
    )
    serve.add_argument(
        "--public-url",
        default=None,
        metavar="URL",
        help="the dashboard's address as people reach it, for links in notifications",
    )

    serve.add_argument(
        "--auth",
        choices=["required", "off"],
        default=None,
        help="required: every request needs a token (trainvitals token create); off: anyone "
        "who reaches the port may do anything, allowed on a loopback address only "
        "(default: off on a loopback address, else required)",
    )

    token = commands.add_parser(
        "token",
        help="create, list and revoke access tokens",
        description="Access tokens of a server's database: a role (ingest, read, admin or "
        "metrics) on "
        "one project, or on every project with --project '*'. Agents send theirs as "
        "$TRAINVITALS_TOKEN; a browser signs in with one.",
    )
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_commands.add_parser(
        "create", help="create a token and print it (the only time it is shown)"
    )
    create.add_argument("--project", required=True, help="its project, or '*' for every project")
    create.add_argument(
        "--role",
        required=True,
        choices=["ingest", "read", "admin", "metrics"],
        help="what it may do (metrics: scrape GET /metrics only, with --project '*')",
    )
    create.add_argument("--name", default=None, help="who holds it (default: role@project)")
    token_list = token_commands.add_parser("list", help="list tokens (never their secrets)")
    revoke = token_commands.add_parser("revoke", help="revoke a token and end its sessions")
    revoke.add_argument("id", help="the token's id (trainvitals token list)")

    db = commands.add_parser(
        "db",
        help="bring a server's database to the current schema",
        description="Database maintenance. The server also upgrades its database when it starts.",
    )
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser(
        "upgrade",
        help="apply the schema migrations the database lacks and print its revision",
        description="Apply the schema migrations (Alembic) the database lacks, including to a "
        "database made before migrations; safe to run again, and while replicas start.",
    )
    for sub in (create, token_list, revoke, upgrade):
        sub.add_argument(
            "--db", default=None, help="the server's database (default $TRAINVITALS_DB)"
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

    runs = commands.add_parser(
        "runs",
        help="list runs, newest first (as trainvitals.Api().runs())",
        description="List a server's runs, newest first (or by --sort), with the filters of "
        "the dashboard's runs list. Reads the server's HTTP API; needs httpx "
        "(pip install 'trainvitals[client]').",
    )
    runs.add_argument("--project", default=None, help="only this project's runs")
    runs.add_argument(
        "--status",
        action="append",
        default=None,
        choices=["running", "stalled", "finished", "crashed", "lost"],
        help="only runs in this status (repeatable)",
    )
    runs.add_argument("--job", default=None, metavar="ID", help="only the workers of this job")
    runs.add_argument("--name", default=None, metavar="TEXT", help="only names containing TEXT")
    runs.add_argument("--tag", default=None, help="only runs with this tag")
    runs.add_argument(
        "--health",
        default=None,
        choices=["critical", "warning", "healthy"],
        help="only runs whose worst alert was this (healthy: none)",
    )
    runs.add_argument(
        "--archived",
        default="hide",
        choices=["hide", "only", "include"],
        help="archived runs (default hide)",
    )
    runs.add_argument(
        "--sort",
        default="started_at",
        metavar="KEY",
        help="started_at (default), name, project, status, last_step, last_seen, host, "
        "ended_at, or a series' statistic: min:NAME, max:NAME, last:NAME",
    )
    runs.add_argument("--ascending", action="store_true", help="sort ascending")
    runs.add_argument(
        "--metric",
        action="append",
        default=None,
        metavar="[STAT:]NAME",
        help="a column of a series' last value, or its min or max (min:val_loss); repeatable",
    )
    runs.add_argument(
        "--limit", type=int, default=50, metavar="N", help="at most N runs (default 50; 0: all)"
    )
    runs.add_argument("--offset", type=int, default=0, metavar="N", help="skip the first N")
    runs.add_argument("--json", action="store_true", help="print the runs as a JSON list")

    export = commands.add_parser(
        "export",
        help="write a run's series at full resolution (CSV, JSON Lines or Parquet)",
        description="Write every point of a run's series, as the server stored them, one row "
        "a point: name, step, time, value; of several runs, in one file: run_id, run_name, "
        "name, step, time, value (see docs/contract.md#export). Reads the server's HTTP API; "
        "needs httpx (pip install 'trainvitals[client]').",
    )
    export.add_argument(
        "run_id",
        metavar="RUN_ID",
        nargs="+",
        help="the run's id (trainvitals.Api().runs()); several: their points in one file",
    )
    export.add_argument(
        "--name",
        action="append",
        default=None,
        metavar="SERIES",
        help="a series to export (repeatable; default every series of the run)",
    )
    export.add_argument(
        "--format", choices=["csv", "jsonl", "parquet"], default="csv", help="(default csv)"
    )
    export.add_argument(
        "--min-step", type=int, default=None, metavar="N", help="only points from step N on"
    )
    export.add_argument(
        "--max-step", type=int, default=None, metavar="N", help="only points up to step N"
    )
    for reader in (runs, export):
        reader.add_argument(
            "--server",
            default=None,
            help=f"server URL (default $TRAINVITALS_SERVER, else {DEFAULT_SERVER})",
        )
        reader.add_argument(
            "--token",
            default=None,
            help="an access token with the read role (default $TRAINVITALS_TOKEN)",
        )
    export.add_argument(
        "-o", "--output", default=None, metavar="FILE", help="file to write (default stdout)"
    )

    sync = commands.add_parser(
        "sync",
        help="deliver the frames runs left on disk when the server was away at their end",
        description="Send the frames that ended training processes could not deliver (the "
        "server was down, or at another address, when training ended), kept in their spool "
        "directories, then delete each spool once the server acknowledged it all. Each run "
        "gets every point once and its true ending. The next run started on the machine "
        "does the same for its own server's runs. See docs/operations.md.",
    )
    sync.add_argument(
        "path",
        nargs="*",
        metavar="PATH",
        help="a run's spool directory, or a directory of them (default $TRAINVITALS_SPOOL_DIR, "
        "else ~/.cache/trainvitals/spool, and the temporary directory's trainvitals-spool-USER)",
    )
    sync.add_argument(
        "--server",
        default=None,
        help="server URL to deliver to (default: the one each run was sent to)",
    )
    sync.add_argument(
        "--token",
        default=None,
        help="an access token with the ingest role (default $TRAINVITALS_TOKEN)",
    )
    sync.add_argument(
        "--dry-run",
        action="store_true",
        help="list the spooled runs and what each holds; send nothing",
    )

    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    # Each command imports its own stack only when it runs: `serve` the server extra, `demo`
    # TensorFlow and scikit-learn, so `--help` and the light agent install stay fast.
    if args.command == "serve":
        from trainvitals.cli.server import serve_command

        return serve_command(args)
    if args.command == "token":
        from trainvitals.cli.tokens import token_command

        return token_command(args)
    if args.command == "db":
        from trainvitals.cli.database import db_command

        return db_command(args)
    if args.command == "notify-test":
        from trainvitals.cli.server import notify_test_command

        return notify_test_command(args)
    if args.command == "runs":
        from trainvitals.cli.runs import runs_command

        return runs_command(args)
    if args.command == "export":
        from trainvitals.cli.export import export_command

        return export_command(args)
    if args.command == "sync":
        from trainvitals.cli.sync import sync_command

        return sync_command(args)
    from trainvitals.cli.demo import demo_command

    return demo_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
