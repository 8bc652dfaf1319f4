"""What an idle server costs the host: how often its threads wake, and the CPU they take.

A server with no agent and no browser is started (``trainvitals serve``, SQLite), left to
settle, then watched for a window: each thread's voluntary context switches (a thread that
sleeps and wakes again counts one: a timer's tick, a poll) and the CPU time of all of them
(``schedstat``, to the nanosecond). The event loop's thread is reported apart: the timers of
the server's own loops wake it.

``--against REF`` starts the server at git ``REF`` (a temporary worktree) alternated with
this checkout's, the order swapped each round, and prints this / REF: the median of the
rounds' ratios and their range.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cli_startup import command, env_for, sources
from harness.processes import ServerProcess, cpu_seconds


def switches(pid: int) -> tuple[int, int]:
    """Voluntary context switches so far: the loop's thread (the process's first), and all."""
    main = total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    count = int(line.split()[1])
                    total += count
                    if task.name == str(pid):
                        main = count
    return main, total


def watch(src: str, db: str, settle: float, window: float) -> dict[str, float]:
    """One idle server of ``src``: its wake-ups a second (loop thread, all) and CPU ms a second."""
    server = ServerProcess(db, extra_env={"PYTHONPATH": src})
    try:
        pid = server.process.pid
        time.sleep(settle)  # start-up's work done: what is left is idling
        main, total = switches(pid)
        cpu = cpu_seconds(pid)
        began = time.monotonic()
        time.sleep(window)  # the measurement: what the server does while nobody asks
        elapsed = time.monotonic() - began
        main2, total2 = switches(pid)
        cpu2 = cpu_seconds(pid)
    finally:
        server.stop()
    return {
        "loop thread wake-ups/s": (main2 - main) / elapsed,
        "all threads' wake-ups/s": (total2 - total) / elapsed,
        "CPU ms/s": (cpu2 - cpu) * 1000 / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before watching")
    parser.add_argument("--window", type=float, default=20.0, help="seconds watched")
    parser.add_argument("--against", metavar="REF", help="a git commit to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sides = sources(args.against, stack)
        for side, src in sides.items():
            # Each side's database at its own schema (another commit may have other migrations).
            db = str(Path(tmp) / f"{side}.db")
            command(["-m", "trainvitals", "db", "upgrade", "--db", db], env_for(src))()
        seen: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for side in order:
                db = str(Path(tmp) / f"{side}.db")
                seen[side].append(watch(sides[side], db, args.settle, args.window))
        report(seen, args)


def report(seen: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    print(f"{args.rounds} rounds of an idle server, {args.window:.0f} s watched each; medians\n")
    header, rule = "| measure | this |", "| --- | --- |"
    if "ref" in seen:
        header += f" {args.against} | this / {args.against} [range] |"
        rule += " --- | --- |"
    print(header)
    print(rule)
    for name in seen["this"][0]:
        this = [r[name] for r in seen["this"]]
        line = f"| {name} | {statistics.median(this):.2f} |"
        if "ref" in seen:
            ref = [r[name] for r in seen["ref"]]
            ratios = [a / b for a, b in zip(this, ref, strict=True) if b]
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
            ratio = f"{statistics.median(ratios):.3f}x" if ratios else "-"
            line += f" {statistics.median(ref):.2f} | {ratio} [{spread}] |"
        print(line, flush=True)


if __name__ == "__main__":
    main()
