"""A loop of fits with one ``VitalsCallback`` against the same loop bare: the memory each fit
leaves behind, the traces of the train step after the first fit, and the seconds a fit takes.

Folds, curriculum stages and "a little more training at each turn" call ``fit`` again and
again: whatever the callback costs once per fit is paid at every turn. Each loop runs in a
fresh process (one model, 20 steps a fit, a real server for the callback), its RSS read after
``gc`` at the end of every fit; the growth is taken from the fifth fit to the last, past the
first fits' start-up. Printed side by side, with the callback's ratios to the bare loop.

    python benchmarks/fit_loop.py [--fits 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.processes import ServerProcess

LOOP = textwrap.dedent(
    """
    import gc, json, os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np, keras, trainvitals

    server, fits = sys.argv[1], int(sys.argv[2])
    traces = 0

    class Counted(keras.Sequential):
        def train_step(self, data):
            global traces
            traces += 1
            return super().train_step(data)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    rng = np.random.default_rng(0)
    x, y = rng.random((2048, 32), dtype=np.float32), rng.integers(0, 4, 2048)
    model = Counted([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                     keras.layers.Dense(4)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [] if server == "-" else [trainvitals.VitalsCallback(
        server=server, project="fit-loop", run_name="loop", system_metrics=False,
        watchdog=False, notebook=False)]
    memory, seconds, traced = [], [], []
    for _ in range(fits):
        began, before = time.perf_counter(), traces
        model.fit(x, y, batch_size=64, epochs=1, steps_per_epoch=20, verbose=0,
                  callbacks=callbacks)
        seconds.append(time.perf_counter() - began)
        traced.append(traces - before)
        gc.collect()
        memory.append(rss())
    print(json.dumps({"memory": memory, "seconds": seconds, "traces": traced}))
    """
)


def loop(server: str, fits: int) -> dict[str, list[float]]:
    done = subprocess.run(
        [sys.executable, "-c", LOOP, server, str(fits)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def figures(result: dict[str, list[float]]) -> dict[str, float]:
    memory, seconds, traces = result["memory"], result["seconds"], result["traces"]
    later = sorted(seconds[1:])
    return {
        "mib_per_fit": (memory[-1] - memory[4]) / (len(memory) - 5),
        "traces_per_later_fit": sum(traces[1:]) / (len(traces) - 1),
        "seconds_per_later_fit": later[len(later) // 2],
        "first_fit_seconds": seconds[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fits", type=int, default=40)
    args = parser.parse_args()
    if args.fits < 10:
        parser.error("--fits: at least 10 (the growth is taken from the fifth fit on)")
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(str(Path(tmp) / "loop.db"))
        try:
            bare = figures(loop("-", args.fits))
            tapped = figures(loop(server.url, args.fits))
        finally:
            server.stop()
    for name, values in (("bare", bare), ("with the callback", tapped)):
        print(
            f"{name:18} {values['mib_per_fit']:+.2f} MiB a fit, "
            f"{values['traces_per_later_fit']:.2f} traces a later fit, "
            f"{values['seconds_per_later_fit']:.3f} s a later fit "
            f"(first fit {values['first_fit_seconds']:.2f} s)"
        )
    print(
        f"ratio, seconds a later fit with the callback / bare: "
        f"{tapped['seconds_per_later_fit'] / bare['seconds_per_later_fit']:.2f}"
    )


if __name__ == "__main__":
    main()
