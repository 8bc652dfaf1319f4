"""Fault injection (#44): what a real server loses, doubles, and how long it takes to recover
when its storage or itself fails under a streaming agent.

Each scenario runs ``trainvitals serve`` and an agent (``trainvitals.Run``) logging two series
a step every 5 ms, injects one fault, and reports the points sent, stored and duplicated (from
the full-resolution export) and the seconds to recover: from the end of the fault until
``/healthz`` answers 200 (``recover_s``) and until the agent has every point acknowledged
(``drained_s``). Faults:

  pg-N         a private PostgreSQL (initdb in a temp dir) stopped for N s under the stream,
               then started (N from --outages: 1, 6 and 30 by default)
  pg-idle-N    the same with no agent connected during the outage; a run made after it
               must be stored
  disk-full    SQLite on a small tmpfs filled by another file until writes fail, then freed
               (needs root to mount a tmpfs; reported as skipped otherwise)
  sigkill      the server SIGKILLed mid-stream and started again on the same port and file
  end-offline  the server down as training ends (half its frames and its end spooled), then
               back: `trainvitals sync` delivers them

    python benchmarks/faults.py [--only pg-6,sigkill] [--outages 1,6,30] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.polling import wait_for
from harness.processes import ServerProcess
from harness.services import private_postgres
from trainvitals import Run, resolve

#: Seconds between two logged steps, as a small training loop.
STEP_EVERY = 0.005
SERIES = ("loss", "acc")


class Streamer:
    """An agent logging :data:`SERIES` a step every :data:`STEP_EVERY` s on a thread."""

    def __init__(self, url: str, project: str = "faults") -> None:
        self.run = Run(resolve(server=url, project=project), system_metrics=False,
                       watchdog=False)  # fmt: skip
        self.run.start()
        self.steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(STEP_EVERY):
            self.steps += 1
            self.run.log(self.steps, {"loss": 1.0 / self.steps, "acc": 0.5})

    def finish(self, timeout: float = 120.0) -> bool:
        self._stop.set()
        self._thread.join()
        return self.run.finish(timeout=timeout)


def healthy(server: ServerProcess) -> bool:
    try:
        with urllib.request.urlopen(server.url + "/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def counted(server: ServerProcess, run_id: str, sent_steps: int) -> dict[str, int]:
    """Points sent, stored, duplicated and missing, from the run's full-resolution export."""
    url = f"{server.url}/api/v1/runs/{run_id}/export?" + "&".join(f"name={n}" for n in SERIES)
    with urllib.request.urlopen(url, timeout=120) as response:
        rows = list(csv.DictReader(io.StringIO(response.read().decode())))
    keys = [(row["name"], int(row["step"])) for row in rows]
    unique = set(keys)
    expected = {(name, step) for name in SERIES for step in range(1, sent_steps + 1)}
    return {
        "sent": len(expected),
        "stored": len(unique),
        "duplicated": len(keys) - len(unique),
        "missing": len(expected - unique),
    }


def tracebacks(server: ServerProcess) -> dict[str, Any]:
    """Tracebacks the server logged, and the first line of each: a fault must leave none."""
    lines = server.output().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    heads = {lines[i - 1][:160] for i in starts if i > 0}
    return {"tracebacks": len(starts), "traceback_after": sorted(heads)}


def recovered(server: ServerProcess, since: float) -> float:
    wait_for(lambda: healthy(server), timeout=120, interval=0.05, what="/healthz 200")
    return round(time.monotonic() - since, 2)


def pg_outage(seconds: float, streaming: bool) -> dict[str, Any]:
    with private_postgres() as pg:
        server = ServerProcess(pg.url)
        try:
            agent = Streamer(server.url) if streaming else None
            time.sleep(1.0)  # a second of steady streaming before the fault
            pg.stop()
            saw_503 = False
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                saw_503 = saw_503 or not healthy(server)
                time.sleep(0.1)
            pg.start()
            back = time.monotonic()
            result: dict[str, Any] = {"outage_s": seconds, "healthz_503_seen": saw_503}
            result["recover_s"] = recovered(server, back)
            if agent is not None:
                drained = agent.finish()
                result["drained_s"] = round(time.monotonic() - back, 2)
                result["acknowledged"] = drained
                result |= counted(server, agent.run.id, agent.steps)
            else:
                after = Streamer(server.url)
                time.sleep(0.5)
                result["new_run_acknowledged"] = after.finish()
                result["drained_s"] = round(time.monotonic() - back, 2)
                result |= counted(server, after.run.id, after.steps)
            result |= tracebacks(server)
            return result
        finally:
            server.stop()


@contextlib.contextmanager
def small_tmpfs(mib: int) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="tv-tmpfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def disk_full() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "mounting a tmpfs needs root: run as root, or see docs/operations.md"}
    with small_tmpfs(64) as disk:
        server = ServerProcess(str(disk / "tv.db"))
        filler = disk / "filler"
        try:
            agent = Streamer(server.url)
            time.sleep(1.0)
            # Fill what is left but a little: the database's next growth meets a full disk.
            free = shutil.disk_usage(disk).free
            with filler.open("wb") as out:
                out.truncate(0)
                out.write(b"\0" * max(0, free - 256 * 1024))
            try:
                wait_for(lambda: not healthy(server), timeout=30, interval=0.05)
                saw_503 = True
            except AssertionError:  # nothing failed: the database did not need to grow
                saw_503 = False
            time.sleep(2.0)  # the disk stays full a while
            filler.unlink()
            freed = time.monotonic()
            result: dict[str, Any] = {"healthz_503_seen": saw_503}
            result["recover_s"] = recovered(server, freed)
            result["acknowledged"] = agent.finish()
            result["drained_s"] = round(time.monotonic() - freed, 2)
            result |= counted(server, agent.run.id, agent.steps)
            result |= tracebacks(server)
            return result
        finally:
            server.stop()


def sigkill() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "tv.db")
        server = ServerProcess(db)
        port = server.port
        try:
            agent = Streamer(server.url)
            time.sleep(1.0)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
            time.sleep(1.0)  # down a second
            server.stop()
            started = time.monotonic()
            server = ServerProcess(db, port=port)
            result: dict[str, Any] = {"restart_s": round(time.monotonic() - started, 2)}
            result["recover_s"] = recovered(server, started)
            result["acknowledged"] = agent.finish()
            result["drained_s"] = round(time.monotonic() - started, 2)
            result |= counted(server, agent.run.id, agent.steps)
            return result
        finally:
            server.stop()


def end_offline() -> dict[str, Any]:
    """The server goes away before training ends: the run's last frames and its end stay in
    the spool on disk; the server comes back and `trainvitals sync` delivers them."""
    with tempfile.TemporaryDirectory() as tmp:
        db, spool = str(Path(tmp) / "tv.db"), Path(tmp) / "spool"
        server = ServerProcess(db)
        port = server.port
        try:
            run = Run(resolve(server=server.url, project="faults", spool_dir=spool),
                      system_metrics=False, watchdog=False)  # fmt: skip
            run.start()
            steps = 0
            for steps in range(1, 2001):  # some delivered, the rest after the server went
                run.log(steps, {"loss": 1.0 / steps, "acc": 0.5})
                if steps == 1000:
                    time.sleep(0.5)
                    server.stop()
            result: dict[str, Any] = {"acknowledged_at_exit": run.finish(timeout=2.0)}
            result["spooled_runs"] = len([p for p in spool.iterdir() if p.is_dir()])
            started = time.monotonic()
            server = ServerProcess(db, port=port)
            done = subprocess.run(
                [sys.executable, "-m", "trainvitals", "sync", "--server", server.url, str(spool)],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            result["sync_exit"] = done.returncode
            result["recover_s"] = round(time.monotonic() - started, 2)
            result |= counted(server, run.id, steps)
            ended = server.get(f"/api/v1/runs/{run.id}")
            result["status"], result["end_reason"] = ended["status"], ended["end_reason"]
            result |= tracebacks(server)
            return result
        finally:
            server.stop()


def scenarios(outages: list[float]) -> dict[str, Callable[[], dict[str, Any]]]:
    found: dict[str, Callable[[], dict[str, Any]]] = {}
    for seconds in outages:
        found[f"pg-{seconds:g}"] = lambda s=seconds: pg_outage(s, streaming=True)
        found[f"pg-idle-{seconds:g}"] = lambda s=seconds: pg_outage(s, streaming=False)
    found["disk-full"] = disk_full
    found["sigkill"] = sigkill
    found["end-offline"] = end_offline
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="1,6,30", help="PostgreSQL outages, seconds")
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    table = scenarios([float(s) for s in args.outages.split(",")])
    chosen = args.only.split(",") if args.only else list(table)
    report: dict[str, Any] = {}
    for name in chosen:
        started = time.monotonic()
        try:
            report[name] = table[name]()
        except Exception as exc:  # one scenario's failure is reported, the others still run
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        report[name]["wall_s"] = round(time.monotonic() - started, 1)
        print(name, json.dumps(report[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    lost = sum(r.get("missing", 0) + r.get("duplicated", 0) for r in report.values())
    return 1 if lost or any("error" in r for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
