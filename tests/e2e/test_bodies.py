"""Malformed bodies against a real server with auth required: each a 4xx whose answer never
holds the value sent, never a 500, never a traceback or the value in the log; and names that
could forge a log line refused, over HTTP and in an agent's hello."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from harness.processes import ServerProcess, create_token, stream

#: What each body carries where the value would be: on sign-in, the token itself.
SECRET = "tv_s3cr3t-value"


@dataclass
class Server:
    process: ServerProcess
    admin: str
    ingest: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = str(tmp_path_factory.mktemp("bodies") / "tv.db")
    admin = create_token(db, "*", "admin", "alice")
    ingest = create_token(db, "p", "ingest", "agents")
    process = ServerProcess(db, args=["--auth", "required"])
    try:
        yield Server(process, admin, ingest)
    finally:
        process.stop()


def send(
    server: Server, method: str, path: str, body: bytes, token: str | None = None
) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.process.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        connection.close()


#: Bodies FastAPI's own parsing or 422 renderer failed on (a 500 with a traceback holding the
#: value), or that could reach storage as something it cannot store.
MALFORMED = [
    b'{"token": "\\ud800' + SECRET.encode() + b'"}',  # a lone surrogate
    b'{"token": "' + SECRET.encode() + b'\\udc00"}',
    b'{"token": 1e999, "x": "' + SECRET.encode() + b'"}',  # read as infinity
    b'{"token": -1e999}',
    b'{"token": NaN}',
    b'{"token": Infinity}',
    b'{"token": ' + b"9" * 5000 + b"}",  # beyond Python's int digits
    b'{"token": ' + b"9" * 400 + b"}",
    b"[" * 100_000 + b"]" * 100_000,  # nested past the parser's recursion
    b'{"token": {"a": ' * 2000 + b"1" + b"}" * 2001,
    b'{"token": "\xff\xfe' + SECRET.encode() + b'"}',  # not UTF-8
    b'{"\\ud800' + SECRET.encode() + b'": 1}',  # in a key
    b'{"token": ["' + SECRET.encode() + b'"]}',  # the wrong type: a 422 must not echo it
    b'{"token": "' + SECRET.encode() + b'",',  # cut short
]


@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_sign_in_is_a_4xx_that_never_echoes_the_token(
    server: Server, body: bytes
) -> None:
    status, answer = send(server, "POST", "/api/v1/session", body)
    assert 400 <= status < 500, (status, answer)
    assert SECRET not in answer and "s3cr3t" not in answer
    json.loads(answer)  # an answer a client can read
    output = server.process.output()
    assert "Traceback" not in output and "s3cr3t" not in output


@pytest.mark.parametrize("path", ["/api/v1/tokens", "/api/v1/alerts/x/silence"])
def test_non_finite_and_surrogate_bodies_are_400_on_every_json_route(
    server: Server, path: str
) -> None:
    for body in (b'{"name": "a\\ud800", "project": "p", "role": "read"}', b'{"duration_s": 1e999}'):
        status, answer = send(server, "POST", path, body, server.admin)
        assert status == 400 and "malformed JSON body" in answer, (status, answer)


@pytest.mark.parametrize("char", ["\u0085", "\u2028", "\u2029", "\x1b", "\x9b", "\u202e"])
def test_names_refuse_line_separators_and_controls(server: Server, char: str) -> None:
    run_id = stream(server.process, server.ingest, "p")
    name = f"fine{char}forged"
    body = json.dumps({"name": name}).encode()
    status, answer = send(server, "PATCH", f"/api/v1/runs/{run_id}", body, server.admin)
    assert status == 422 and char not in answer, answer
    body = json.dumps({"name": name, "project": "p", "role": "read"}).encode()
    status, _ = send(server, "POST", "/api/v1/tokens", body, server.admin)
    assert status == 422
    url = server.process.url.replace("http", "ws", 1) + "/api/v1/ingest"
    hello = {"type": "hello", "v": 1, "run_id": "forged", "project": "p", "name": name,
             "started_at": 1.0}  # fmt: skip
    with connect(url, additional_headers={"Authorization": f"Bearer {server.ingest}"}) as ws:
        ws.send(json.dumps(hello))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    assert char not in closed.value.rcvd.reason


@pytest.mark.parametrize("started_at", [1e300, -5.0])
def test_a_hello_from_outside_any_sane_time_is_refused(server: Server, started_at: float) -> None:
    url = server.process.url.replace("http", "ws", 1) + "/api/v1/ingest"
    hello = {"type": "hello", "v": 1, "run_id": "when", "project": "p", "name": "when",
             "started_at": started_at}  # fmt: skip
    with connect(url, additional_headers={"Authorization": f"Bearer {server.ingest}"}) as ws:
        ws.send(json.dumps(hello))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    assert "started_at" in closed.value.rcvd.reason


def test_a_config_with_an_infinity_is_shown_not_a_500(server: Server, tmp_path: Path) -> None:
    """A hello's config is the user's, kept as sent: a non-finite value in it must still let
    the run be read."""
    url = server.process.url.replace("http", "ws", 1) + "/api/v1/ingest"
    hello = ('{"type": "hello", "v": 1, "run_id": "inf-config", "project": "p", "name": "n", '
             '"started_at": 1.0, "config": {"lr": 1e999, "clip": NaN}}')  # fmt: skip
    with connect(url, additional_headers={"Authorization": f"Bearer {server.ingest}"}) as ws:
        ws.send(hello)
        welcome = ws.recv(timeout=10)
    status, answer = send(server, "GET", "/api/v1/runs/inf-config", b"", server.admin)
    assert status == 200 or (status == 400 and "welcome" not in welcome), (status, answer)
    status, _ = send(server, "GET", "/api/v1/runs", b"", server.admin)
    assert status == 200
