"""The server in this process: the app ``trainvitals serve`` runs, started by its own lifespan
and spoken to through Starlette's test client (HTTP and websockets in memory, no uvicorn).

The fast tier of the server's tests: ingest sessions, the websockets' close codes and the alert
engine, fed frames as an agent sends them and read back as the agent and the HTTP API see them,
on a real SQLite file through the real writer. What only a real server shows (the upgrade and its
refusals, uvicorn's own limits, processes that die) stays in ``tests/e2e``.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest
from starlette.testclient import TestClient, WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

from trainvitals.protocol import INGEST_PATH, LIVE_PATH
from trainvitals.server.app import create_app
from trainvitals.server.deps import AppState
from trainvitals.server.settings import Settings

#: A new run's hello; tests change what they need with ``{**HELLO, ...}``.
HELLO = {"type": "hello", "v": 1, "run_id": "r1", "project": "p", "name": "one",
         "started_at": 1.0}  # fmt: skip


@contextmanager
def in_process(settings: Settings) -> Iterator[TestClient]:
    """The server of ``settings``, started (its lifespan run) until the block ends."""
    app = create_app(settings)
    # Without auth the server answers this machine only: the client says it is here.
    client = TestClient(app, base_url="http://127.0.0.1:8600", client=("127.0.0.1", 50000))
    try:
        with client:
            yield client
    finally:
        # The lifespan freezes what start-up built, for a server's lifetime: not this test's.
        gc.unfreeze()


def app_state(client: TestClient) -> AppState:
    """The parts the running app shares (store, writer, alert engine, ...)."""
    state: AppState = client.app.state.trainvitals  # type: ignore[attr-defined]
    return state


def ingest(client: TestClient, token: str | None = None) -> WebSocketTestSession:
    """An agent's connection to ``/api/v1/ingest`` (a context manager), with ``token``."""
    return _websocket(client, INGEST_PATH, token)


def live(client: TestClient, token: str | None = None) -> WebSocketTestSession:
    """A browser's connection to ``/api/v1/live`` (a context manager), with ``token``."""
    return _websocket(client, LIVE_PATH, token)


def _websocket(client: TestClient, path: str, token: str | None) -> WebSocketTestSession:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # A URL of its own: the client's websockets do not follow its ``base_url``.
    return client.websocket_connect(f"ws://127.0.0.1:8600{path}", headers=headers)


def send(ws: WebSocketTestSession, frame: Mapping[str, object]) -> None:
    ws.send_text(json.dumps(frame))


def reply(ws: WebSocketTestSession, frame: Mapping[str, object]) -> dict[str, object]:
    """Send ``frame``; the server's answer to it."""
    send(ws, frame)
    answer: dict[str, object] = json.loads(ws.receive_text())
    return answer


def closed_after(ws: WebSocketTestSession, *frames: str | bytes) -> tuple[int, str]:
    """Send ``frames`` as they are (text, or a binary frame for bytes); the close code and
    reason the server then ends ``ws`` with."""
    for frame in frames:
        if isinstance(frame, bytes):
            ws.send_bytes(frame)
        else:
            ws.send_text(frame)
    return closed_with(ws)


def closed_with(ws: WebSocketTestSession) -> tuple[int, str]:
    """The close code and reason the server ends ``ws`` with (replies before it are read)."""
    with pytest.raises(WebSocketDisconnect) as closed:
        while True:
            ws.receive_text()
    return closed.value.code, closed.value.reason


def points(seq: int, series: Mapping[str, tuple[list[int], list[float]]]) -> dict[str, object]:
    """A ``points`` frame: each series' steps and values, stamped one second a step."""
    columns = {
        name: {"step": steps, "time": [float(s) for s in steps], "value": values}
        for name, (steps, values) in series.items()
    }
    return {"type": "points", "v": 1, "seq": seq, "series": columns}
