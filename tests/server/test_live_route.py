"""``WS /api/v1/live`` in this process: a browser is held to small requests for real run ids,
each refusal its own close code, and the server lives on.

tests/e2e/test_live.py keeps points reaching a browser from a real agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from harness.inprocess import closed_after, in_process, live
from trainvitals.server.settings import Settings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with in_process(Settings(db=str(tmp_path / "tv.db"))) as client:
        yield client


def refused(client: TestClient, *requests: str | bytes) -> tuple[int, str]:
    with live(client) as ws:
        return closed_after(ws, *requests)


def test_a_live_client_is_held_to_small_requests_for_real_run_ids(client: TestClient) -> None:
    code, reason = refused(client, "subscribe me")
    assert code == 1007 and "subscribe" in reason
    big = json.dumps({"type": "subscribe", "run_id": "r" * 4 * 2**20})
    assert refused(client, big) == (1009, "live requests are at most 1 KiB")
    odd = json.dumps({"type": "subscribe", "run_id": "../x\n"})
    assert refused(client, odd)[0] == 1007
    many = [json.dumps({"type": "subscribe", "run_id": f"r{i}"}) for i in range(257)]
    assert refused(client, *many) == (1008, "at most 256 runs a connection")
    # A binary frame, and a kilobyte of nesting: each its own close code, no traceback (the
    # first raised a KeyError out of the route, the second a RecursionError; either would
    # be raised here, out of the client).
    binary = json.dumps({"type": "subscribe", "run_id": "r1"}).encode()
    assert refused(client, binary) == (1003, "expected JSON text frames, got a binary frame")
    assert refused(client, "[" * 1000)[0] == 1007
    with live(client) as ws:  # the server lives on
        ws.send_text(json.dumps({"type": "subscribe", "run_id": "r1"}))
    assert client.get("/healthz").json() == {"status": "ok", "writer": "ok"}
