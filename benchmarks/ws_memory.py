"""The memory websocket clients can make a server hold: ``trainvitals serve`` with auth
required, and N connections without a token (and, with ``--token``, N with one), each sending
one permessage-deflate frame of zeros that inflates to ``--mib`` MiB (a few KB on the wire).
Reports the server's RSS idle, at the peak while they are open, and once they have gone; with
``--against REF`` the same for the code at git REF, side by side.

    python benchmarks/ws_memory.py [--connections 100] [--mib 8] [--against HEAD~5] [--json PATH]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.processes import ServerProcess, create_token, git_worktree

ROOT = Path(__file__).resolve().parent.parent


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def compressed_frame(mib: int) -> bytes:
    """One masked text frame, permessage-deflate (RSV1), inflating to ``mib`` MiB of zeros."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = deflate.compress(b"0" * (mib << 20)) + deflate.flush(zlib.Z_SYNC_FLUSH)
    payload = payload[:-4]  # RFC 7692: the sync flush's empty block is left off
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    size = len(payload)
    head = bytes([0x80 | 0x40 | 0x1])  # FIN, RSV1 (compressed), text
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", size)
    return head + mask + masked


def attack(port: int, connections: int, mib: int, token: str | None) -> dict[str, int]:
    """``connections`` sockets, each sending the upgrade request and, without waiting for the
    answer, one compressed frame (as a hostile client may: the server reads it as soon as it
    upgrades). How many the server refused at the upgrade (an HTTP error) or upgraded (101)."""
    frame = compressed_frame(mib)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    outcome = {"refused": 0, "upgraded": 0, "compressed": 0, "failed": 0}
    sockets = []
    for _ in range(connections):
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Extensions: permessage-deflate\r\n{auth}\r\n"
        )
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(request.encode() + frame)
            sockets.append(sock)
        except OSError:
            outcome["failed"] += 1
    for sock in sockets:
        try:
            answer = sock.recv(4096)
            status = answer.split(b" ", 2)[1]
            outcome["upgraded" if status == b"101" else "refused"] += 1
            outcome["compressed"] += b"permessage-deflate" in answer.lower()
        except (OSError, IndexError):
            outcome["failed"] += 1
    time.sleep(3)  # a benchmark, not a test: each server reads and inflates what it was sent
    for sock in sockets:
        sock.close()
    return outcome


@contextmanager
def server_at(source: Path, db: str) -> Iterator[ServerProcess]:
    env = {"PYTHONPATH": f"{source / 'src'}{os.pathsep}{ROOT}"}
    server = ServerProcess(db, extra_env=env, args=["--auth", "required"])
    try:
        yield server
    finally:
        server.stop()


def measure(source: Path, connections: int, mib: int, with_token: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "tv.db")
        token = create_token(db, "*", "ingest", "bench")
        with server_at(source, db) as server:
            time.sleep(1)  # start-up's garbage settles before the idle figure
            pid = server.process.pid
            idle = rss_mib(pid)
            peak = idle
            stop = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, rss_mib(pid))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            result: dict[str, Any] = {"idle_mib": round(idle, 1)}
            result["anonymous"] = attack(server.port, connections, mib, None)
            result["anonymous_peak_mib"] = round(peak, 1)
            result["after_anonymous_mib"] = round(rss_mib(pid), 1)
            if with_token:
                result["token"] = attack(server.port, connections, mib, token)
                result["token_peak_mib"] = round(peak, 1)
                result["after_token_mib"] = round(rss_mib(pid), 1)
            stop.set()
            sampler.join()
            return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--token", action="store_true", help="also N connections with a token")
    parser.add_argument("--against", help="a git ref to measure too (the code before)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    report: dict[str, Any] = {"connections": args.connections, "frame_mib": args.mib}
    if args.against:
        with git_worktree(args.against) as tree:
            report[args.against] = measure(tree, args.connections, args.mib, args.token)
    report["this tree"] = measure(ROOT, args.connections, args.mib, args.token)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
