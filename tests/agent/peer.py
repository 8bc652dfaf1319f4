"""A scripted ingest server for the agent's unit tests: a real websocket server on a free
loopback port, in a thread, that records every frame and answers like trainvitals does
(``welcome`` to a hello, ``ack`` to each numbered frame), or as a test tells it to."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from websockets.sync.server import Server, ServerConnection, serve

from trainvitals.protocol import ACK, END, HELLO, WELCOME

#: An agent's settings for tests of what is sent at the next look (0.2 s) and what waits:
#: a regular send an hour away, no sampler, no watchdog.
HOURLY_SENDS: dict[str, Any] = {
    "flush_interval": 3600,
    "read_interval": 0.2,
    "system_metrics": False,
    "watchdog": False,
}


class Peer:
    """Records frames per connection; ``last_seq`` is what its welcome says was stored."""

    def __init__(self) -> None:
        self.connections: list[list[dict[str, Any]]] = []
        self.last_seq = 0
        #: Drop the connection (without acking) when a frame with this seq arrives, once.
        self.drop_at: int | None = None
        #: Answer the hello with this instead of a welcome.
        self.welcome_override: dict[str, Any] | None = None
        #: What each connection's welcome lists as ``features``, by connection (none after).
        self.features: list[list[str]] = []
        #: Set: the ``end`` frame is acknowledged only once it is set.
        self.hold_end: threading.Event | None = None
        #: Each connection's Authorization header (None when absent).
        self.authorizations: list[str | None] = []
        #: Frames sent after each welcome (a newer server's, of types the agent may not know).
        self.after_welcome: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.socket.getsockname()[:2]
        return f"ws://{host}:{port}/api/v1/ingest"

    def frames(self) -> list[dict[str, Any]]:
        with self._lock:
            return [frame for frames in self.connections for frame in frames]

    def numbered(self) -> list[int]:
        return [f["seq"] for f in self.frames() if "seq" in f]

    def _handle(self, ws: ServerConnection) -> None:
        received: list[dict[str, Any]] = []
        with self._lock:
            index = len(self.connections)
            self.connections.append(received)
            self.authorizations.append(
                ws.request.headers.get("Authorization") if ws.request else None
            )
        for text in ws:
            frame = json.loads(text)
            with self._lock:
                received.append(frame)
            if frame["type"] == HELLO:
                answer = self.welcome_override or {
                    "type": WELCOME,
                    "v": 1,
                    "run_id": frame["run_id"],
                    "last_seq": self.last_seq,
                }
                if index < len(self.features):
                    answer = {**answer, "features": self.features[index]}
                ws.send(json.dumps(answer))
                for extra in self.after_welcome:
                    ws.send(json.dumps(extra))
            elif "seq" in frame:
                if self.drop_at == frame["seq"]:
                    self.drop_at = None
                    return  # the connection ends unacknowledged
                if frame["type"] == END and self.hold_end is not None:
                    self.hold_end.wait(30)
                self.last_seq = max(self.last_seq, frame["seq"])
                ws.send(json.dumps({"type": ACK, "seq": frame["seq"]}))


@contextmanager
def running_peer() -> Iterator[Peer]:
    peer = Peer()
    with serve(peer._handle, "127.0.0.1", 0) as server:
        peer._server = server
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield peer
        finally:
            server.shutdown()
            thread.join(5)
