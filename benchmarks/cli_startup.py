"""How long the ``trainvitals`` commands take to start, each in a fresh process.

Measured: ``trainvitals --version``, ``token list`` and ``db upgrade`` on a SQLite file that
is already at the current schema (what an admin types, and what a deploy script runs before
each replica), and ``serve`` until its ``/healthz`` answers (what a restart or a new
replica waits for). Each command's time is printed against the interpreter's own start
(``python -c pass``), measured in the same rounds.

``--against REF`` times the same commands at git ``REF`` (a temporary worktree, imported ahead
of this checkout) alternated with this checkout's, the order swapped each round, and prints
this / REF per command: the median of the rounds' ratios and their range.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.processes import ROOT, ServerProcess, git_worktree

COMMANDS = {
    "--version": ["--version"],
    "token list": ["token", "list", "--db", "{db}"],
    "db upgrade": ["db", "upgrade", "--db", "{db}"],
}


def timed(run: Callable[[], None]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def command(args: list[str], env: dict[str, str]) -> Callable[[], None]:
    def run() -> None:
        subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)

    return run


def serve(db: str, env: dict[str, str]) -> Callable[[], None]:
    """``trainvitals serve`` from its start until ``/healthz`` answers (then stopped)."""

    def run() -> None:
        ServerProcess(db, extra_env=env).stop()

    return run


def env_for(src: str) -> dict[str, str]:
    """The environment that imports the package in ``src`` ahead of the installed one."""
    return {**os.environ, "PYTHONPATH": src}


def timings(src: str, db: str) -> dict[str, Callable[[], None]]:
    """Each measured command, run against the package in ``src`` and its own database ``db``
    (brought to that code's schema first: another commit may have other migrations)."""
    env = env_for(src)
    command(["-m", "trainvitals", "db", "upgrade", "--db", db], env)()
    runs = {"python -c pass": command(["-c", "pass"], env)}
    for name, args in COMMANDS.items():
        runs[name] = command(["-m", "trainvitals", *(a.format(db=db) for a in args)], env)
    runs["serve (to /healthz)"] = serve(db, {"PYTHONPATH": src})
    return runs


def sources(against: str | None, stack: contextlib.ExitStack) -> dict[str, str]:
    """Each side's package source: this checkout's ("this") and, ``against`` a git ref, that
    ref's in a worktree that goes with ``stack`` ("ref"); each checked to be what it imports."""
    sides = {"this": str(ROOT / "src")}
    if against:
        sides["ref"] = str(stack.enter_context(git_worktree(against)) / "src")
    for side, src in sides.items():
        where = imported_from(src)
        if not where.startswith(str(Path(src).resolve())):
            raise RuntimeError(f"{side} imported trainvitals from {where}")
    return sides


def imported_from(src: str) -> str:
    code = "import trainvitals; print(trainvitals.__file__)"
    done = subprocess.run([sys.executable, "-c", code], env=env_for(src), check=True,
                          capture_output=True)  # fmt: skip
    return done.stdout.decode().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", metavar="REF", help="a git commit to compare with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sides = sources(args.against, stack)
        runs = {side: timings(src, str(Path(tmp) / f"{side}.db")) for side, src in sides.items()}
        seconds: dict[str, dict[str, list[float]]] = {
            side: {name: [] for name in runs[side]} for side in sides
        }
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in runs["this"]:
                for side in order:
                    seconds[side][name].append(timed(runs[side][name]))
        report(seconds, args)


def report(seconds: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    this = seconds["this"]
    base = this["python -c pass"]
    print(f"{args.rounds} rounds, fresh processes; median seconds\n")
    header = "| command | this | x python -c pass |"
    rule = "| --- | --- | --- |"
    if "ref" in seconds:
        header += f" {args.against} | this / {args.against} [range] |"
        rule += " --- | --- |"
    print(header)
    print(rule)
    for name, values in this.items():
        line = f"| {name} | {statistics.median(values):.3f} s | "
        line += f"{statistics.median(v / b for v, b in zip(values, base, strict=True)):.2f}x |"
        if "ref" in seconds:
            ref = seconds["ref"][name]
            ratios = [a / b for a, b in zip(values, ref, strict=True)]
            line += (
                f" {statistics.median(ref):.3f} s | {statistics.median(ratios):.3f}x "
                f"[{min(ratios):.3f}-{max(ratios):.3f}] |"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
