"""``trainvitals demo``: a real small Keras training, streaming to a server."""

from __future__ import annotations

import argparse
import sys


def demo_command(args: argparse.Namespace) -> int:
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
