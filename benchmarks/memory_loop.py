"""A loop of fits that keeps something of each, under a real memory cgroup, until the kernel
kills it: how long before the kill the process's memory warning came, how many memory alerts
one leak raised, how the end was called; and what one host reading costs the sampler.

Each "fit" is a ``trainvitals.Monitor`` run of ``--fit`` seconds of paced steps, its memory
flat after its start, with the real per-second sampler reading the cgroup; each fit begins
by allocating ``rate`` MiB (touched) that the loop keeps. No TensorFlow: the leak, the
cgroup and the rules are what is measured. Needs root and a writable memory cgroup (v1 or v2).

    python benchmarks/memory_loop.py [--limit-mib 600] [--rates 16,32,64] [--fit 4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.polling import wait_for
from harness.processes import ServerProcess, in_cgroup, memory_cgroup
from trainvitals.agent.host import HostSource, process_memory, read_memory_cgroup

LOOP = textwrap.dedent(
    """
    import sys, time, trainvitals
    server, rate, fit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    kept = []
    for fold in range(10_000):
        with trainvitals.Monitor(server=server, run_name=f"fold-{fold}") as mon:
            kept.append(bytearray(rate * 2**20))  # the fold's data and model, kept after it
            began, step = time.monotonic(), 0
            while time.monotonic() - began < fit:
                step += 1
                time.sleep(0.05)
                mon.log(step, metrics={"loss": 1.0 / step})
    """
)

MEMORY_RULES = ("oom_forecast", "memory_pressure")


def one_leak(
    server: ServerProcess, limit: int, rate: int, fit: float, script: Path
) -> dict[str, Any]:
    with memory_cgroup(limit) as group:
        began = time.time()
        result = subprocess.run(
            [*in_cgroup(group), sys.executable, str(script), server.url, str(rate), str(fit)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        killed = time.time()
    runs = wait_for(
        lambda: (
            (r := server.get("/api/v1/runs?limit=10000")["runs"])
            and r[0]["status"] == "crashed"
            and r
        ),
        timeout=60,
        what="the last fit's end",
    )
    alerts = [
        a for a in server.get("/api/v1/alerts?limit=10000")["alerts"] if a["rule"] in MEMORY_RULES
    ]
    first = min((a["time"] for a in alerts if a["rule"] == "oom_forecast"), default=None)
    lead = None if first is None else killed - first
    return {
        "rate": rate,
        "returncode": result.returncode,
        "fits": len(runs),
        "life_s": killed - began,
        "lead_s": lead,
        "share": None if lead is None else lead / (killed - began),
        "alerts": sorted(f"{a['rule']}:{a['subject']}" for a in alerts),
        "end": runs[0]["end_reason"],
    }


def sampler_cost(readings: int = 2000) -> dict[str, float]:
    """Microseconds per reading here (median of 5 batches): the whole ``HostSource.sample()``,
    its memory readings alone (``/proc/self/status`` and the cgroup's two files), and the
    ``psutil`` RSS reading those replaced."""
    import psutil

    source, process, group = HostSource(), psutil.Process(), read_memory_cgroup()

    def memory() -> None:
        process_memory()
        if group is not None:
            group.working_set()

    costs: dict[str, list[float]] = {"sample": [], "memory": [], "psutil_rss": []}
    for _ in range(5):
        for name, read in (
            ("sample", source.sample),
            ("memory", memory),
            ("psutil_rss", process.memory_info),
        ):
            started = time.perf_counter()
            for _ in range(readings // 5):
                read()
            costs[name].append((time.perf_counter() - started) / (readings // 5) * 1e6)
    return {name: statistics.median(values) for name, values in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit-mib", type=int, default=600)
    parser.add_argument("--rates", default="16,32,64", help="MiB kept per fit, comma-separated")
    parser.add_argument("--fit", type=float, default=4.0, help="seconds a fit lasts")
    args = parser.parse_args()
    cost = sampler_cost()
    sample, memory, rss = cost["sample"], cost["memory"], cost["psutil_rss"]
    print(f"host sample: {sample:.0f} µs, of which the memory readings {memory:.0f} µs "
          f"(psutil's RSS they replace: {rss:.0f} µs)\n")  # fmt: skip
    print("| kept a fit | fits | life (s) | forecast before the kill (s) | share of life | "
          "memory alerts | end |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(LOOP)
        for rate in (int(r) for r in args.rates.split(",")):
            server = ServerProcess(str(Path(tmp) / f"loop-{rate}.db"))
            try:
                found = one_leak(server, args.limit_mib * 2**20, rate, args.fit, script)
            finally:
                server.stop()
            lead = "missed" if found["lead_s"] is None else f"{found['lead_s']:.0f}"
            share = "-" if found["share"] is None else f"{found['share']:.0%}"
            print(f"| {rate} MiB | {found['fits']} | {found['life_s']:.0f} | {lead} | {share} | "
                  f"{len(found['alerts'])} ({', '.join(found['alerts'])}) | {found['end']} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
