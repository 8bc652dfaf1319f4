"""The request guard: Host, Origin, JSON-only writes and the body limit, before any route."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from trainvitals.server.guard import LOCAL_ONLY, RequestGuard, allowed_hosts, is_loopback


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"bytes": len(body)})


async def socket(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("hi")
    await websocket.close()


def client(
    hosts: frozenset[str],
    public_url: str | None = None,
    local_only: bool = False,
    address: str = "testclient",
) -> TestClient:
    app = Starlette(
        routes=[Route("/w", echo, methods=["GET", "POST"]), WebSocketRoute("/ws", socket)]
    )
    guarded = RequestGuard(
        app, hosts, public_url=public_url, max_body_bytes=1000, local_only=local_only
    )
    return TestClient(guarded, base_url="http://127.0.0.1:8600", client=(address, 50000))


LOOPBACK = allowed_hosts("127.0.0.1", None)


def test_hosts_a_server_answers_to() -> None:
    assert {"localhost", "127.0.0.1", "::1"} <= LOOPBACK and "evil.example" not in LOOPBACK
    assert "tv.example.org" in allowed_hosts("0.0.0.0", "https://tv.example.org")
    assert allowed_hosts("0.0.0.0", None) == frozenset()  # any, until told the names
    assert "10.0.0.5" in allowed_hosts("10.0.0.5", None)
    assert allowed_hosts("127.0.0.1", None, ["*"]) == frozenset()
    assert is_loopback("[::1]") and is_loopback("127.3.2.1") and not is_loopback("10.0.0.1")
    assert is_loopback("::ffff:127.0.0.1") and not is_loopback("::ffff:10.0.0.1")


def test_a_rebound_host_name_is_refused() -> None:
    with client(LOOPBACK) as http:
        assert http.get("/w").status_code == 200
        refused = http.get("/w", headers={"Host": "evil.example:8600"})
        assert refused.status_code == 400 and "unknown host" in refused.text


def test_a_request_from_another_origin_is_refused_and_its_own_passes() -> None:
    with client(LOOPBACK) as http:
        own = {"Origin": "http://127.0.0.1:8600", "Content-Type": "application/json"}
        assert http.post("/w", content=b"{}", headers=own).status_code == 200
        other = {"Origin": "http://localhost:9999", "Content-Type": "application/json"}
        assert http.post("/w", content=b"{}", headers=other).status_code == 403
        assert http.get("/w", headers={"Origin": "http://127.0.0.1:8601"}).status_code == 403
        # An opaque origin (a sandboxed frame, a file) is no origin of this server's.
        for opaque in ("null", "", "file://", "not a url"):
            assert http.get("/w", headers={"Origin": opaque}).status_code == 403, opaque


def test_the_public_url_is_an_origin_of_its_own() -> None:
    with client(
        allowed_hosts("0.0.0.0", "https://tv.example.org"), "https://tv.example.org"
    ) as http:
        headers = {"Host": "tv.example.org", "Origin": "https://tv.example.org"}
        assert http.get("/w", headers=headers).status_code == 200


def test_writes_take_json_only() -> None:
    with client(LOOPBACK) as http:
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            answer = http.post("/w", content=b"x=1", headers={"Content-Type": kind})
            assert answer.status_code == 415
        assert http.post("/w").status_code == 200  # no body: nothing to smuggle


def test_a_body_over_the_limit_gets_413_before_it_is_read() -> None:
    with client(LOOPBACK) as http:
        json_ = {"Content-Type": "application/json"}
        assert http.post("/w", content=b"1" * 1000, headers=json_).json() == {"bytes": 1000}
        assert http.post("/w", content=b"1" * 1001, headers=json_).status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: the guard counts what arrives
            yield b"1" * 600
            yield b"1" * 600

        assert http.post("/w", content=chunks(), headers=json_).status_code == 413


def test_a_cross_origin_websocket_is_closed_before_it_opens() -> None:
    with client(LOOPBACK) as http:
        own = {"Host": "127.0.0.1:8600"}
        with http.websocket_connect("/ws", headers=own) as ws:  # an agent: no Origin
            assert ws.receive_text() == "hi"
        with pytest.raises(WebSocketDisconnect) as closed:
            with http.websocket_connect("/ws", headers={**own, "Origin": "http://evil.example"}):
                pass
        assert closed.value.code == 1008


def test_without_auth_only_this_machine_is_answered_whatever_host_it_names() -> None:
    """``create_app`` served by hand on every interface, auth off: a client elsewhere that
    names ``Host: localhost`` passed the Host check, and spoke as an admin of every project."""
    for address in ("10.0.0.9", "192.0.2.2", "2001:db8::1"):
        with client(frozenset(), local_only=True, address=address) as http:
            refused = http.get("/w", headers={"Host": "localhost"})
            assert refused.status_code == 403 and refused.text == LOCAL_ONLY
            with pytest.raises(WebSocketDisconnect), http.websocket_connect("/ws"):
                pass
    for address in ("127.0.0.1", "::1", "127.0.0.2"):
        with client(frozenset(), local_only=True, address=address) as http:
            assert http.get("/w").status_code == 200
            with http.websocket_connect("/ws") as ws:
                assert ws.receive_text() == "hi"
    with client(frozenset(), address="10.0.0.9") as http:  # with auth: the token decides
        assert http.get("/w").status_code == 200
