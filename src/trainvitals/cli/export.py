"""``trainvitals export RUN_ID [RUN_ID ...]``: a run's series at full resolution (several
runs' in one file), from a server's HTTP API."""

from __future__ import annotations

import argparse
import os
import sys

from trainvitals.exceptions import ApiError, ConfigurationError


def export_command(args: argparse.Namespace) -> int:
    try:
        from trainvitals.client import Api

        api = Api(server=args.server, token=args.token)
    except ConfigurationError as exc:
        print(f"trainvitals export: {exc}", file=sys.stderr)
        return 2
    steps = {"min_step": args.min_step, "max_step": args.max_step}
    runs = args.run_id[0] if len(args.run_id) == 1 else args.run_id
    try:
        if args.output in (None, "-"):
            api.export(runs, args.name or (), format=args.format, to=sys.stdout.buffer, **steps)
            sys.stdout.buffer.flush()
            return 0
        # Written beside the file and moved over it once whole: a failed export leaves
        # no half file behind.
        partial = args.output + ".part"
        try:
            with open(partial, "wb") as out:
                written = api.export(runs, args.name or (), format=args.format, to=out, **steps)
            os.replace(partial, args.output)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        print(f"wrote {written:,} bytes to {args.output}", file=sys.stderr)
        return 0
    except ApiError as exc:
        print(f"trainvitals export: {exc}", file=sys.stderr)
        return 1
    finally:
        api.close()
