"""How fast the runs list opens with many runs (#17): the list route's time for page 1 and for
a search, a sort and a far page, and the page's load time in Chromium until the first page of
runs is drawn.

The runs are written straight into a fresh SQLite file through the server's storage (see
``harness.seed``), then ``trainvitals serve`` reads them like any others.

    python benchmarks/dashboard.py [--runs 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from harness.browser import chromium
from harness.processes import ServerProcess
from harness.seed import seed_runs


def timed_get(url: str, repeat: int) -> tuple[float, float]:
    """Median and worst wall time of ``repeat`` GETs, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "runs.db")
        start = time.perf_counter()
        seed_runs(db, args.runs)
        print(f"seeded {args.runs} runs in {time.perf_counter() - start:.1f} s")
        server = ServerProcess(db)
        try:
            routes = {
                "page 1 (50 runs)": "/api/v1/runs?limit=50",
                "search q=run-01": "/api/v1/runs?limit=50&q=run-01",
                "sort by name": "/api/v1/runs?limit=50&sort=name&order=asc",
                "last page": f"/api/v1/runs?limit=50&offset={max(0, args.runs - 50)}",
                "status + config columns": "/api/v1/runs?limit=50&status=crashed&config=lr",
                "500 runs (the old default)": "/api/v1/runs?limit=500",
            }
            for label, path in routes.items():
                median, worst = timed_get(server.url + path, args.repeat)
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
                    f"Chromium: runs page drawn (page 1 of {args.runs}) median "
                    f"{statistics.median(loads):.0f} ms, max {max(loads):.0f} ms "
                    "(navigation until the first page is in the table)"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
