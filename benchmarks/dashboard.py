"""The dashboard's speed (#17), in two parts.

1. The runs list with many runs: the list route's time for page 1 and for a search, a sort
   and a far page, and the page's load time in Chromium until the first page of runs is
   drawn. The runs are written straight into a fresh SQLite file through the server's storage
   (see ``harness.seed``), then ``trainvitals serve`` reads them like any others.
2. A run page while a run streams ``--rate`` steps a second with 30 series: the long tasks
   (PerformanceObserver ``longtask``, main-thread tasks over 50 ms) while it opens, then in a
   ``--seconds`` trace once every chart is drawn; a Chromium trace of the same window tells
   how much of the longest tasks was the page's own CPU time (the rest: other processes of a
   shared machine held the core).
3. A run of ``--points`` points (a million by default) opened: the time until its loss chart
   is drawn.

    python benchmarks/dashboard.py [--runs 10000] [--repeat 20] [--rate 250] [--seconds 10]
                                   [--points 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.browser import chromium
from harness.processes import ServerProcess
from harness.seed import seed_runs
from trainvitals import Run, resolve

LAYERS = 26  # with loss, accuracy, grad/global_norm and step_time: 30 series

LONG_TASKS = """
window.longTasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.longTasks.push(entry.duration);
}).observe({ type: "longtask", buffered: true });
"""


def stream(server: ServerProcess, rate: float, stop: threading.Event, started: list[str]) -> None:
    """A run logging ``rate`` steps a second, 30 series a step, until ``stop``."""
    run = Run(resolve(server=server.url, project="bench", run_name="streaming"),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    started.append(run.id)
    step, begin = 0, time.monotonic()
    while not stop.is_set():
        step += 1
        values = {"loss": 1.0 / step, "accuracy": 1 - 1.0 / step, "grad/global_norm": 1.0,
                  "step_time": 1 / rate}  # fmt: skip
        values.update({f"grad/norm/layer_{i}/kernel": 0.1 * (i + 1) for i in range(LAYERS)})
        run.log(step, values)
        ahead = begin + step / rate - time.monotonic()
        if ahead > 0:
            stop.wait(ahead)  # pacing the producer, not synchronising a test
    run.finish()


def long_run(points: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "long.db")
        (run_id,) = seed_runs(db, 1, steps=points)
        server = ServerProcess(db)
        try:
            with chromium() as browser:
                loads = []
                for _ in range(3):
                    page = browser.new_page(viewport={"width": 1440, "height": 900})
                    start = time.perf_counter()
                    page.goto(f"{server.url}/#/runs/{run_id}")
                    drawn = """() => document.querySelector('[data-chart="loss"]')
                               ?.dataset.drawn > 0"""
                    page.wait_for_function(drawn, timeout=60_000)
                    loads.append((time.perf_counter() - start) * 1000)
                    page.close()
            route, _ = timed_get(f"{server.url}/api/v1/runs/{run_id}/series", 5)
        finally:
            server.stop()
    print(f"GET the series of a run of {points} points (every series, 2000 each): {route:.0f} ms")
    print(
        f"Chromium: a run of {points} points opened, its loss chart drawn: median "
        f"{statistics.median(loads):.0f} ms, max {max(loads):.0f} ms"
    )


#: Every chart of the streamed run drawn: the loss and gradient charts and the layers' heatmap.
DRAWN = """() => ['loss', 'grad_norm'].every((id) =>
             document.querySelector(`[data-chart="${id}"]`)?.dataset.drawn > 0)
           && document.querySelector('[data-chart="grad_heatmap"]')?.dataset.layers > 0"""


#: A task of the main thread, as Chromium's trace names it (older versions, newer versions).
_TASKS = ("RunTask", "ThreadControllerImpl::RunTask")


def main_thread_tasks(trace: bytes) -> tuple[list[tuple[float, float]], float]:
    """From a Chromium trace: (wall, CPU) milliseconds of each task over 50 ms on the page's
    main thread, longest first, and the CPU milliseconds of all its tasks. CPU is the thread's
    own time: what the page cost, whatever else ran on the machine."""
    events = json.loads(trace)["traceEvents"]
    main = {
        (e["pid"], e["tid"])
        for e in events
        if e.get("name") == "thread_name" and e["args"].get("name") == "CrRendererMain"
    }
    tasks = [
        (e["dur"] / 1000, e.get("tdur", 0) / 1000)
        for e in events
        if e.get("name") in _TASKS and (e["pid"], e["tid"]) in main and "dur" in e
    ]
    return sorted((t for t in tasks if t[0] > 50), reverse=True), sum(cpu for _, cpu in tasks)


def live_page(rate: float, seconds: float) -> None:
    """Long tasks while the page opens (until every chart is drawn), then in a ``seconds``
    trace of the page following the stream."""
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "live.db"))
        stop = threading.Event()
        started: list[str] = []
        producer = threading.Thread(target=stream, args=(server, rate, stop, started))
        producer.start()
        try:
            while not started:
                time.sleep(0.05)
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.add_init_script(LONG_TASKS)
                page.goto(f"{server.url}/#/runs/{started[0]}")
                page.wait_for_function(DRAWN, timeout=30_000)
                opening = page.evaluate("window.longTasks")
                page.evaluate("window.longTasks = []")
                load = os.getloadavg()[0]
                browser.start_tracing(page=page, categories=["toplevel", "devtools.timeline"])
                first = int(page.locator('[data-chart="loss"]').get_attribute("data-points") or 0)
                time.sleep(seconds)  # the trace's window
                tasks = page.evaluate("window.longTasks")
                last = int(page.locator('[data-chart="loss"]').get_attribute("data-points") or 0)
                traced, cpu_in_all = main_thread_tasks(browser.stop_tracing())
        finally:
            stop.set()
            producer.join()
            server.stop()
    print(
        f"Chromium: run page opened while a run streams: {len(opening)} long tasks, longest "
        f"{max(opening, default=0):.0f} ms"
    )
    wall, cpu = traced[0] if traced else (0.0, 0.0)
    print(
        f"Chromium: run page streaming {rate:.0f} steps/s x 30 series for {seconds:.0f} s "
        f"(load average {load:.1f} on {os.cpu_count()} cores): {last - first} loss points drawn, "
        f"{len(tasks)} long tasks, longest {max(tasks, default=0):.0f} ms, {sum(tasks):.0f} ms "
        f"blocked in all; traced: the longest {wall:.0f} ms, of which {cpu:.0f} ms the page's "
        f"own CPU; the most CPU in one task {max((c for _, c in traced), default=0):.0f} ms; "
        f"the page's CPU in all {cpu_in_all:.0f} ms"
    )


def timed_get(url: str, repeat: int) -> tuple[float, float]:
    """Median and worst wall time of ``repeat`` GETs, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def runs_list(count: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "runs.db")
        start = time.perf_counter()
        seed_runs(db, count)
        print(f"seeded {count} runs in {time.perf_counter() - start:.1f} s")
        server = ServerProcess(db)
        try:
            routes = {
                "page 1 (50 runs)": "/api/v1/runs?limit=50",
                "search q=run-01": "/api/v1/runs?limit=50&q=run-01",
                "sort by name": "/api/v1/runs?limit=50&sort=name&order=asc",
                "last page": f"/api/v1/runs?limit=50&offset={max(0, count - 50)}",
                "status + config columns": "/api/v1/runs?limit=50&status=crashed&config=lr",
                "500 runs (the old default)": "/api/v1/runs?limit=500",
            }
            for label, path in routes.items():
                median, worst = timed_get(server.url + path, repeat)
                print(f"GET {label:28} median {median:7.1f} ms  max {worst:7.1f} ms")
            with chromium() as browser:
                loads = []
                for _ in range(5):
                    page = browser.new_page(viewport={"width": 1440, "height": 900})
                    start = time.perf_counter()
                    page.goto(server.url + "/")
                    page.locator("#page-range").filter(has_text="of").wait_for(timeout=30_000)
                    loads.append((time.perf_counter() - start) * 1000)
                    page.close()
                print(
                    f"Chromium: runs page drawn (page 1 of {count}) median "
                    f"{statistics.median(loads):.0f} ms, max {max(loads):.0f} ms "
                    "(navigation until the first page is in the table)"
                )
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--points", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.runs:  # --runs 0: the live part only
        runs_list(args.runs, args.repeat)
    live_page(args.rate, args.seconds)
    if args.points:
        long_run(args.points)


if __name__ == "__main__":
    main()
