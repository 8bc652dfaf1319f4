"""The agent's reliability, measured side by side in one run:

1. ``fit`` time per step with the server up vs with it down (nothing listening, the spool
   taking what memory does not hold), alternated rounds, medians compared: should be ~1.0;
2. points lost and duplicated across a server SIGKILL and restart in the middle of a
   ``fit``: must be 0;
3. seconds from SIGKILL of a training process (the demo's Keras CNN) to the server showing
   the run ``crashed`` with ``signal:SIGKILL`` (the watchdog's report);
4. spool replay: a server comes up to a run with N frames waiting, most of them spooled on
   disk; frames/s and points/s until the run's ``end`` is stored after all of them.

    python benchmarks/reliability.py [--rounds 9] [--steps 600] [--warmup 100]
                                     [--restart-steps 4000] [--kills 3] [--frames 1000]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras

import trainvitals
from benchmarks.agent_overhead import BATCH, mlp, run_fit
from harness.polling import wait_for
from harness.processes import ServerProcess, demo_training, free_port, run_series

# What 0.2 s of a fast fit makes: 50 steps of 20 series, 1000 points a frame.
SERIES = [
    "loss",
    "accuracy",
    "grad/global_norm",
    "step_time",
    *(f"grad/norm/dense_{i}/kernel" for i in range(16)),
]
STEPS_PER_FRAME = 50


def compiled_mlp() -> tuple[Any, Any, Any]:
    model, x, y = mlp()
    model.compile(
        optimizer="adam",
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, x, y


def fit_up_vs_down(tmp: Path, rounds: int, steps: int, warmup: int) -> None:
    server = ServerProcess(str(tmp / "up.db"))
    # A port bound but not listening: connections are refused, and no later server gets it.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        model, x, y = compiled_mlp()
        run_fit(model, x, y, warmup + 10, warmup, [])  # trace once
        times: dict[str, list[float]] = {"up": [], "down": []}
        for round_ in range(rounds):
            for config in ("up", "down") if round_ % 2 == 0 else ("down", "up"):
                callback = trainvitals.VitalsCallback(
                    server=server.url if config == "up" else down, project="bench"
                )
                times[config].append(run_fit(model, x, y, steps, warmup, [callback]))
        up, down_ = statistics.median(times["up"]), statistics.median(times["down"])
        spooled = sum(f.stat().st_size for f in (tmp / "spool").glob("*/*.seg"))
        print(
            f"fit, small MLP, {steps} steps ({warmup} left out), median of {rounds} alternated "
            f"rounds: server up {up * 1000:.2f} ms/step, server down {down_ * 1000:.2f} ms/step"
            f" -> ratio down/up {down_ / up:.3f}x ({spooled / 2**10:,.0f} KiB spooled to disk "
            "by the down runs)",
            flush=True,
        )
    finally:
        server.stop()
        hole.close()


def restart_mid_fit(tmp: Path, steps: int) -> None:
    port, db = free_port(), str(tmp / "restart.db")
    servers = [ServerProcess(db, port=port)]
    model, x, y = compiled_mlp()
    callback = trainvitals.VitalsCallback(server=servers[0].url, project="bench", run_name="kill")
    outage: list[float] = []

    def kill_and_restart() -> None:
        wait_for(
            lambda: any(
                (r["last_step"] or 0) >= steps // 4 for r in servers[0].get("/api/v1/runs")["runs"]
            ),
            timeout=120,
            what="a quarter of the fit",
        )
        killed = time.monotonic()
        servers[0].process.send_signal(signal.SIGKILL)
        servers[0].process.wait()
        servers[0].stop()
        servers.append(ServerProcess(db, port=port))
        outage.append(time.monotonic() - killed)

    killer = threading.Thread(target=kill_and_restart)
    killer.start()
    epochs = -(-steps // (len(x) // BATCH))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[callback])
    killer.join()
    server = servers[-1]
    try:
        assert callback.run is not None
        run_id, last = callback.run.id, callback.run.last_step
        wait_for(
            lambda: server.get(f"/api/v1/runs/{run_id}")["status"] == "finished",
            timeout=120,
            what="the run's end",
        )
        stored = run_series(server, run_id, "loss")["loss"]["step"]
        lost = len(set(range(1, last + 1)) - set(stored))
        duplicated = len(stored) - len(set(stored))
        names = server.get(f"/api/v1/runs/{run_id}")["series"]
        total = sum(len(s["step"]) for s in run_series(server, run_id, *names).values())
        print(
            f"server SIGKILLed at step ~{steps // 4} of a {last}-step fit and restarted "
            f"({outage[0]:.1f} s away): per-step loss points lost {lost}, duplicated {duplicated} "
            f"({total:,} points stored in {len(names)} series)",
            flush=True,
        )
    finally:
        server.stop()


def sigkill_to_crashed(tmp: Path, kills: int) -> None:
    server = ServerProcess(str(tmp / "kill.db"))
    seconds: list[float] = []
    try:
        for i in range(kills):
            name = f"killed-{i}"

            def run(name: str = name) -> dict[str, Any]:
                runs = [r for r in server.get("/api/v1/runs")["runs"] if r["name"] == name]
                return runs[0] if runs else {}

            training = demo_training(server, name)
            try:
                wait_for(lambda: (run().get("last_step") or 0) >= 5, timeout=120)
                training.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                crashed = wait_for(
                    lambda: run().get("status") == "crashed" and run(),
                    timeout=30,
                    interval=0.005,
                    what="the watchdog's report",
                )
                seconds.append(time.monotonic() - killed)
                assert crashed["end_reason"] == "signal:SIGKILL", crashed
            finally:
                training.kill()
                training.wait()
        print(
            f"SIGKILL of a training process -> run crashed, signal:SIGKILL on the server: "
            f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s "
            f"over {kills} kills",
            flush=True,
        )
    finally:
        server.stop()


def spool_replay(tmp: Path, frames: int) -> None:
    port, spool_dir = free_port(), tmp / "replay-spool"
    memory = 4 * 2**20
    run = trainvitals.Run(
        trainvitals.resolve(
            server=f"http://127.0.0.1:{port}",
            project="bench",
            run_name="replay",
            flush_interval=0.01,  # one frame per chunk below, quickly
            spool_dir=spool_dir,
            spool_after_bytes=memory,
        ),
        system_metrics=False,
        watchdog=False,
    )
    run.start()
    step = 0
    for chunk in range(frames):
        for _ in range(STEPS_PER_FRAME):
            step += 1
            run.log(step, {name: 1.0 / step for name in SERIES})
        # The benchmark peeks at the sender to make a frame of each chunk.
        wait_for(lambda n=chunk: run._sender.unacknowledged > n, interval=0.001)
    assert run._sender is not None
    frames = run._sender.unacknowledged
    segments = list(spool_dir.glob("*/*.seg"))
    on_disk = sum(f.stat().st_size for f in segments)
    server = ServerProcess(str(tmp / "replay.db"), port=port)
    try:
        started = time.monotonic()
        run.finish(timeout=0.01)  # wakes the sender: it reconnects now, not after its backoff
        wait_for(
            lambda: server.get(f"/api/v1/runs/{run.id}")["status"] == "finished",
            timeout=600,
            interval=0.02,  # not more often: the server answering polls would slow the replay
            what="the replay",
        )
        elapsed = time.monotonic() - started
        stored = len(run_series(server, run.id, "loss")["loss"]["step"])
        assert stored == step, (stored, step)
        points = step * len(SERIES)
        print(
            f"spool replay: {frames} frames of {STEPS_PER_FRAME * len(SERIES)} points "
            f"({on_disk / 2**20:.1f} MiB in {len(segments)} spool files, {memory // 2**20} MiB "
            f"in memory) stored in {elapsed:.2f} s: {frames / elapsed:,.0f} frames/s, "
            f"{points / elapsed:,.0f} points/s; spool left behind: "
            f"{sorted(p.name for p in spool_dir.iterdir())}",
            flush=True,
        )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--restart-steps", type=int, default=4000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--frames", type=int, default=1000)
    args = parser.parse_args()
    logging.getLogger("trainvitals").setLevel(logging.ERROR)  # outages are the point here
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        # Every run here keeps 64 KiB in memory and spools the rest, in a throwaway
        # directory, so the outages below (the down fits, the restart) go through the spool.
        os.environ["TRAINVITALS_SPOOL_DIR"] = str(tmp / "spool")
        os.environ["TRAINVITALS_SPOOL_AFTER_BYTES"] = str(64 * 1024)
        fit_up_vs_down(tmp, args.rounds, args.steps, args.warmup)
        restart_mid_fit(tmp, args.restart_steps)
        sigkill_to_crashed(tmp, args.kills)
        spool_replay(tmp, args.frames)


if __name__ == "__main__":
    main()
