"""``trainvitals runs``: the runs list from a server's HTTP API, as a table or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import TYPE_CHECKING

from trainvitals.cli.formatting import table, when
from trainvitals.exceptions import ApiError, ConfigurationError
from trainvitals.json_types import JsonObject

if TYPE_CHECKING:
    from trainvitals.client import ApiRun

#: The statistics a ``--metric`` column may show (``min:val_loss``); a bare name shows ``last``.
_STATISTICS = ("last", "min", "max")


def runs_command(args: argparse.Namespace) -> int:
    columns = [_metric_column(spec) for spec in args.metric or ()]
    try:
        from trainvitals.client import Api

        api = Api(server=args.server, token=args.token)
    except ConfigurationError as exc:
        print(f"trainvitals runs: {exc}", file=sys.stderr)
        return 2
    try:
        runs = api.runs(
            project=args.project,
            status=args.status,
            job=args.job,
            limit=args.limit or None,
            name=args.name,
            tag=args.tag,
            health=args.health,
            archived=args.archived,
            sort=args.sort,
            descending=not args.ascending,
            offset=args.offset,
            metrics=list(dict.fromkeys(name for _, name in columns)),
        )
    except ApiError as exc:
        print(f"trainvitals runs: {exc}", file=sys.stderr)
        return 1
    finally:
        api.close()
    if args.json:
        print(json.dumps([_as_dict(run) for run in runs], indent=2))
    elif runs:
        print(_table(runs, columns))
    else:
        print("(no runs match)", file=sys.stderr)
    return 0


def _metric_column(spec: str) -> tuple[str, str]:
    """``--metric``'s ``[STAT:]NAME`` as ``(statistic, series name)``."""
    statistic, _, name = spec.partition(":")
    if name and statistic in _STATISTICS:
        return statistic, name
    return "last", spec


def _as_dict(run: ApiRun) -> JsonObject:
    """The run as ``--json`` prints it: every field the server told of it."""
    return {f.name: getattr(run, f.name) for f in fields(run) if f.name != "api"}


def _table(runs: list[ApiRun], columns: list[tuple[str, str]]) -> str:
    header = ["id", "project", "name", "status", "step", "started", "ended", "health", "firing"]
    header += [name if stat == "last" else f"{stat}:{name}" for stat, name in columns]
    rows = [
        [
            run.id,
            run.project,
            run.name,
            run.status,
            "-" if run.last_step is None else str(run.last_step),
            when(run.started_at),
            run.end_reason or "-",
            str(run.health.get("worst") or "healthy"),  # the worst alert it raised
            ",".join(run.health.get("firing") or ()) or "-",
            *(_statistic(run, stat, name) for stat, name in columns),
        ]
        for run in runs
    ]
    return table(header, rows)


def _statistic(run: ApiRun, statistic: str, name: str) -> str:
    summary = run.metrics.get(name)
    if summary is None:
        return "-"
    if statistic == "last" and "nonfinite" in summary:
        return summary["nonfinite"]  # the last value was NaN or ±Inf: say which
    value = {"last": summary["last"], "min": summary["min"], "max": summary["max"]}[statistic]
    return "-" if value is None else f"{value:.6g}"
