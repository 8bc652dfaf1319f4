"""``trainvitals sync [--server URL] [PATH ...]``: deliver the frames that ended processes
left in their spools (the server was away, or at the wrong address, when training ended)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainvitals.agent.config import default_spool_dir
from trainvitals.agent.spool import spool_roots
from trainvitals.agent.sync import deliver, find_spools, load
from trainvitals.agent.transport import UNREACHABLE
from trainvitals.exceptions import ConfigurationError, SpoolError


def sync_command(args: argparse.Namespace) -> int:
    if args.path:
        paths = [Path(p).expanduser() for p in args.path]
    else:
        root = Path(os.environ.get("TRAINVITALS_SPOOL_DIR") or default_spool_dir()).expanduser()
        paths = spool_roots(root)
    spools = find_spools(paths)
    if not spools:
        print(f"no spooled runs in {', '.join(map(str, paths))}", file=sys.stderr)
        return 1 if args.path else 0  # named paths that hold none: a mistake worth saying
    token = args.token or os.environ.get("TRAINVITALS_TOKEN") or None
    failed = 0
    for directory in spools:
        try:
            run = load(directory)
            if args.dry_run:
                frames = sum(1 for _ in run.frames())
                print(
                    f"{directory}: {run.title}, {frames} frames ({run.size():,} bytes) "
                    f"for {args.server or run.server}"
                )
            else:
                print(f"{directory}: {deliver(run, args.server, token).summary()}")
        except (SpoolError, ConfigurationError) as exc:
            print(f"trainvitals sync: {exc}; left in place", file=sys.stderr)
            failed += 1
            continue
        except UNREACHABLE as exc:
            print(
                f"trainvitals sync: {directory}: {run.title} not delivered to "
                f"{args.server or run.server} ({type(exc).__name__}: {exc}); left in place, "
                "run `trainvitals sync` again (--server URL for another address)",
                file=sys.stderr,
            )
            failed += 1
            continue
        for line in run.damage:  # what was readable went; this part could not be read
            print(f"trainvitals sync: lost: {line}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0
