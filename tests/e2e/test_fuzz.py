"""A bounded, seeded fuzz of the ingest websocket while an honest run streams (#15): every
malformed frame closes its own connection with a code and a reason, never a traceback, and
the honest run loses nothing."""

from __future__ import annotations

import copy
import json
import random
import threading
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from harness.processes import ServerProcess, run_series
from trainvitals import Run, resolve

SEED = 15
CONNECTIONS = 600
#: The codes a refusal may carry (docs/protocol.md); 1000 is the server ending normally.
CODES = {1000, 1003, 1007, 1008, 1009, 1013}

VALID: list[dict[str, Any]] = [
    {"type": "hello", "v": 1, "run_id": "fuzz", "project": "f", "name": "n", "started_at": 1.0,
     "host": "h", "pid": 7, "config": {"lr": 0.1}, "env": {}, "run_secret": "s"},
    {"type": "points", "v": 1, "seq": 1,
     "series": {"loss": {"step": [1, 2], "time": [1.0, 2.0], "value": [0.5, 0.4]}}},
    {"type": "points", "v": 1, "seq": 1, "clocks": {"0": {"step": [1, 2], "time": [1.0, 2.0]}},
     "series": {"loss": {"clock": "0", "value": [0.5, 0.4]},
                "lr": {"clock": "0", "value": [0.1, 0.1]}}},
    {"type": "heartbeat", "v": 1, "time": 3.0},
    {"type": "stall", "v": 1, "seq": 2, "time": 4.0, "idle": 40.0, "threshold": 30.0,
     "stacks": "Thread main"},
    {"type": "autopsy", "v": 1, "seq": 3, "time": 5.0, "step": 2, "report": {"origin": "loss"}},
    {"type": "end", "v": 1, "seq": 4, "reason": "exception", "time": 6.0, "traceback": "tb"},
]  # fmt: skip

ODD_VALUES: list[Any] = [
    None, True, -1, 0, 2**63, -(2**63) - 1, 2**64, 1e308, float("nan"), float("inf"), "",
    "x" * 5000, "a\u0000b", "line\nforged", "\ud800", [], {}, [1, [2, [3]]], {"a": {"b": {}}},
]  # fmt: skip


def mutate(rng: random.Random, frame: dict[str, Any]) -> str | bytes:
    """One malformed (or sometimes still valid) frame."""
    choice = rng.randrange(9)
    if choice == 0:
        return json.dumps(frame)[: rng.randrange(1, 40)]  # cut short
    if choice == 1:
        return json.dumps(frame).encode()  # a binary frame
    if choice == 2:
        return json.dumps(rng.choice([[], None, 1, "hello", [frame]]))
    mutated = copy.deepcopy(frame)
    key = rng.choice(sorted(mutated))
    if choice == 3:
        del mutated[key]
    elif choice == 4:
        mutated[rng.choice(["extra", "v", "type", "seq"])] = rng.choice(ODD_VALUES)
    elif choice == 5 and mutated.get("type") == "points":
        column = mutated["series"]["loss"]
        column[rng.choice(["step", "time", "value"])] = [rng.choice(ODD_VALUES)] * 2
    elif choice == 6 and mutated.get("type") == "points":
        mutated["series"] = {rng.choice(ODD_VALUES[10:15]) or "s": mutated["series"]["loss"]}
    elif choice == 7 and "clocks" in mutated:
        if rng.random() < 0.5:
            mutated["clocks"]["0"][rng.choice(["step", "time", "extra"])] = [
                rng.choice(ODD_VALUES)
            ] * rng.randrange(1, 4)
        else:  # a clock the frame lacks, or an odd name for one
            mutated["series"]["lr"]["clock"] = rng.choice(["1", *ODD_VALUES])
    else:
        mutated[key] = rng.choice(ODD_VALUES)
    return json.dumps(mutated, allow_nan=True)


def test_fuzzed_frames_close_with_a_code_and_the_honest_run_loses_nothing(
    server: ServerProcess,
) -> None:
    honest = Run(resolve(server=server.url, project="honest"), system_metrics=False,
                 watchdog=False)  # fmt: skip
    honest.start()
    stop = threading.Event()
    steps = [0]

    def train() -> None:
        while not stop.is_set() and steps[0] < 100_000:
            steps[0] += 1
            honest.log(steps[0], {"loss": 1.0 / steps[0]})
            stop.wait(0.002)

    trainer = threading.Thread(target=train)
    trainer.start()
    rng = random.Random(SEED)
    url = server.url.replace("http", "ws") + "/api/v1/ingest"
    codes: list[int | None] = []
    sent = 0
    try:
        for index in range(CONNECTIONS):
            frames = [dict(VALID[0], run_id=f"fuzz{index}")]
            frames += rng.sample(VALID[1:], rng.randrange(1, len(VALID)))
            with connect(url, max_size=None, open_timeout=10) as ws:
                try:
                    for position, frame in enumerate(frames):
                        # Mostly a valid hello, so the fuzz reaches what comes after it.
                        odds = 0.2 if position == 0 else 0.6
                        ws.send(mutate(rng, frame) if rng.random() < odds else json.dumps(frame))
                        sent += 1
                    ws.send("{")  # end every conversation with a frame that must close it
                    while True:
                        ws.recv(timeout=10)
                except ConnectionClosed as closed:
                    codes.append(closed.rcvd.code if closed.rcvd else None)
    finally:
        stop.set()
        trainer.join(10)
    assert honest.finish()
    assert sent >= 2000, sent
    assert None not in codes, "a connection closed without a close frame"
    assert set(codes) <= CODES, set(codes) - CODES
    output = server.output()
    assert "Traceback" not in output and "Exception in ASGI" not in output
    loss = run_series(server, honest.id, "loss")["loss"]
    assert loss["step"] == list(range(1, steps[0] + 1))  # every honest point stored
