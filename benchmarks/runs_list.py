"""What the runs list's live pushes cost the page, this checkout against git ``REF``'s.

``--runs`` runs stream a step every 0.1 s each to one server (a push of the runs list every
0.5 s); the runs list is open on them in headless Chromium. For ``--seconds`` the page counts
the nodes drawn into its list's body (a ``MutationObserver``: what it inserts, with every
node inside, text included), and Chromium's own counters give the time its main thread spent
on script, style and layout (the counting's own included, on both sides). ``--against REF``
runs the server of git ``REF``, and so its dashboard (a temporary worktree, imported ahead
of this checkout), in rounds alternated with this checkout's, the order swapped each round,
a fresh server, database, runs and page each; it prints each side's medians and this / REF:
the median of the rounds' ratios and their range.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.browser import chromium
from harness.polling import wait_for
from harness.processes import ServerProcess, git_worktree
from trainvitals import Run, resolve

#: Counts the nodes the list's body gains, each with every node inside it, text included (a
#: row drawn anew is some 40 nodes, a cell a few), from when it is called.
COUNT_NODES = """() => {
  const size = (node) => {
    const walker = document.createTreeWalker(node, NodeFilter.SHOW_ALL);
    let n = 1;
    while (walker.nextNode()) n += 1;
    return n;
  };
  window.churn = { added: 0 };
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.addedNodes) window.churn.added += size(node);
    }
  }).observe(document.querySelector("#runs-body"), { childList: true, subtree: true });
}"""
#: Chromium's counters of the main thread's time, in seconds.
BUSY = ("ScriptDuration", "RecalcStyleDuration", "LayoutDuration")


@contextlib.contextmanager
def streaming(server: ServerProcess, runs: int) -> Iterator[None]:
    """``runs`` runs logging a step every 0.1 s each, until the block ends."""
    stop = threading.Event()
    started = [
        Run(resolve(server=server.url, project="bench", run_name=f"run-{i:03d}"),
            system_metrics=False, watchdog=False)
        for i in range(runs)
    ]  # fmt: skip
    for run in started:
        run.start()

    def log() -> None:
        step = 0
        while not stop.wait(0.1):
            step += 1
            for run in started:
                run.log(step, {"loss": 1.0 / step})

    thread = threading.Thread(target=log, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for run in started:
            run.finish()


def busy(cdp: Any) -> float:
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return float(sum(metrics[name] for name in BUSY))


def one_round(browser: Any, src: str | None, runs: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"PYTHONPATH": src} if src else None
        server = ServerProcess(str(Path(tmp) / "bench.db"), extra_env=env)
        try:
            with streaming(server, runs):
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(server.url + "/")
                wait_for(lambda: page.locator("tr.run-row").count() == runs,
                         what="every run listed")  # fmt: skip
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")
                page.evaluate(COUNT_NODES)
                before = busy(cdp)
                time.sleep(seconds)  # a benchmark's window, not a synchronisation
                spent = busy(cdp) - before
                churn = page.evaluate("window.churn")
                page.close()
        finally:
            server.stop()
    return {
        "nodes drawn a second": churn["added"] / seconds,
        "page's main thread, ms a second": spent * 1000 / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="live runs listed (a page: 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="window a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", metavar="REF", help="git ref to compare with")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"this": [], "ref": []}
    with contextlib.ExitStack() as stack:
        browser = stack.enter_context(chromium())
        sides: dict[str, str | None] = {"this": None}
        if args.against:
            sides["ref"] = str(stack.enter_context(git_worktree(args.against)) / "src")
        for n in range(args.rounds):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            for side in order:
                results[side].append(one_round(browser, sides[side], args.runs, args.seconds))
                print(f"round {n + 1}, {side}: {results[side][-1]}", flush=True)
    print(f"\n{args.runs} live runs listed, {args.seconds:g} s a round, {args.rounds} rounds\n")
    print(
        "| measure | this | "
        + (f"{args.against} | this / {args.against} |" if args.against else "")
    )
    for measure in results["this"][0]:
        this = [r[measure] for r in results["this"]]
        line = f"| {measure} | {statistics.median(this):.1f} |"
        if args.against:
            ref = [r[measure] for r in results["ref"]]
            ratios = [a / b for a, b in zip(this, ref, strict=True) if b]
            spread = (
                f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
                if ratios
                else "-"
            )
            line += f" {statistics.median(ref):.1f} | {spread} |"
        print(line)


if __name__ == "__main__":
    main()
