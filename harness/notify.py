"""Notification test helpers: a real HTTP receiver that records every POST and answers as
scripted, a server with channels pointing at it, and a hand-made agent that trips alerts."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, TypedDict

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from websockets.sync.client import ClientConnection, connect

from harness.polling import wait_for
from harness.processes import ServerProcess, free_port
from trainvitals.protocol import PROTOCOL_VERSION


@dataclass(frozen=True)
class Reply:
    """One scripted answer; ``hold`` keeps the request waiting until it is set."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    hold: threading.Event | None = None


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    time: float
    status: int

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def delivery(self) -> str:
        return self.headers["x-trainvitals-delivery"]


class Receiver:
    """``ThreadingHTTPServer`` on a free port. Answers 200 unless :meth:`script` queued
    other replies for a path; :attr:`requests` holds every request, in arrival order."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                arrived = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    script = receiver._scripts.get(self.path, [])
                    reply = script.pop(0) if script else Reply()
                    receiver.requests.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            arrived,
                            reply.status,
                        )
                    )
                if reply.hold is not None:
                    reply.hold.wait(60)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:  # the sender is gone (a killed server)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts.setdefault(path, []).extend(replies)

    def at(self, path: str, accepted_only: bool = False) -> list[Received]:
        with self._lock:
            return [
                r
                for r in self.requests
                if r.path == path and (not accepted_only or 200 <= r.status < 300)
            ]

    def wait(
        self, path: str, count: int, timeout: float = 30.0, accepted_only: bool = True
    ) -> list[Received]:
        """The first ``count`` requests to ``path`` once they are there."""

        def arrived() -> list[Received] | None:
            got = self.at(path, accepted_only)
            return got[:count] if len(got) >= count else None

        return wait_for(arrived, timeout=timeout, what=f"{count} request(s) to {path}")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


SLACK_PATH = "/services/T0001/B0001/slackSECRETtoken"
HOOK_PATH = "/hooks/trainvitals"
HMAC_KEY = "hmacSECRETkey"
PUBLIC_URL = "https://tv.example.org"


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    try:
        yield receiver
    finally:
        receiver.close()


def channels_file(
    tmp_path: Path, receiver: Receiver, more_channels: str = "", **pace: float
) -> Path:
    """A Slack channel (its URL from the environment) and a signed webhook (its key as a
    ``${NAME}`` reference), with ``pace`` settings for both, then ``more_channels`` (TOML)."""
    defaults = "".join(f"{name} = {value}\n" for name, value in pace.items())
    path = tmp_path / "channels.toml"
    path.write_text(
        f"[defaults]\n{defaults}"
        '[[channels]]\nname = "team"\nkind = "slack"\nurl_env = "TEST_SLACK_URL"\n'
        '[[channels]]\nname = "ops"\nkind = "webhook"\n'
        f'url = "{receiver.url(HOOK_PATH)}"\nsecret = "${{TEST_HMAC_KEY}}"\n' + more_channels
    )
    return path


def notifying_server(
    tmp_path: Path,
    receiver: Receiver,
    port: int = 0,
    lease: float = 15.0,
    lost_after: float = 30.0,
    hello_timeout: float = 10.0,
    more_channels: str = "",
    more_env: dict[str, str] | None = None,
    **pace: float,
) -> ServerProcess:
    env = {
        **(more_env or {}),
        "TRAINVITALS_LOST_AFTER": str(lost_after),
        "TRAINVITALS_HELLO_TIMEOUT": str(hello_timeout),
        "TRAINVITALS_NOTIFY": str(channels_file(tmp_path, receiver, more_channels, **pace)),
        "TRAINVITALS_PUBLIC_URL": PUBLIC_URL,
        "TRAINVITALS_NOTIFY_LEASE": str(lease),
        "TEST_SLACK_URL": receiver.url(SLACK_PATH),
        "TEST_HMAC_KEY": HMAC_KEY,
    }
    return ServerProcess(str(tmp_path / "tv.db"), extra_env=env, port=port)


def agent(
    server: ServerProcess, run_id: str, project: str = "default", **fields: Any
) -> ClientConnection:
    """A hand-made agent connection that has said hello (``fields`` replace or add to the
    hello's: ``name``, ``host``, ``process``...). Patient: a test opens hundreds of these one
    after another while the server sweeps the first ones as lost, and on a busy CI machine one
    opening handshake took longer than websockets' default 10 s."""
    ws = connect(server.url.replace("http", "ws") + "/api/v1/ingest", open_timeout=60)
    ws.send(
        json.dumps(
            {
                "type": "hello",
                "v": PROTOCOL_VERSION,
                "run_id": run_id,
                "project": project,
                "name": f"name-{run_id}",
                "config": {},
                "host": "h",
                "pid": 1,
                "started_at": time.time(),
                "env": {},
                "run_secret": f"secret-{run_id}",
                **fields,
            }
        )
    )
    json.loads(ws.recv(timeout=60))
    return ws


class Points(TypedDict):
    """One series' points, as a ``points`` frame carries them without clocks."""

    step: list[int]
    time: list[float]
    value: list[float]


class PointsBody(TypedDict):
    type: Literal["points"]
    seq: int
    series: dict[str, Points]


class EndBody(TypedDict):
    type: Literal["end"]
    seq: int
    reason: str
    time: float


def send(ws: ClientConnection, frame: PointsBody | EndBody) -> None:
    """Send a numbered frame and wait for its ack (the alert and its notices are stored)."""
    ws.send(json.dumps({"v": PROTOCOL_VERSION, **frame}))
    json.loads(ws.recv(timeout=10))


def nan_loss(ws: ClientConnection, seq: int = 1, step: int = 1) -> None:
    loss: Points = {"step": [step], "time": [time.time()], "value": [math.nan]}
    send(ws, {"type": "points", "seq": seq, "series": {"loss": loss}})


def clean_loss(ws: ClientConnection, seq: int, steps: range) -> None:
    """One frame of finite losses over ``steps``: enough of them resolve a ``nonfinite``."""
    now = time.time()
    loss: Points = {
        "step": list(steps),
        "time": [now] * len(steps),
        "value": [1.0 / step for step in steps],
    }
    send(ws, {"type": "points", "seq": seq, "series": {"loss": loss}})


@dataclass
class Mailbox:
    """A real SMTP server (aiosmtpd) on a free port that keeps what it is sent. ``replies``
    answers the next DATA commands (``"451 try later"``) before the default ``250 OK``;
    ``login`` is the only (user, password) it takes when given."""

    port: int = 0
    messages: list[EmailMessage] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    login: tuple[str, str] | None = None
    logins: list[str] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.replies:
            return self.replies.pop(0)
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        parsed = BytesParser(policy=default).parsebytes(envelope.original_content)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 OK"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        user, password = auth_data.login.decode(), auth_data.password.decode()
        self.logins.append(user)
        ok = self.login == (user, password)
        return AuthResult(success=ok, handled=False)  # the server answers 235 or 535

    def wait(self, count: int, timeout: float = 30.0) -> list[EmailMessage]:
        def arrived() -> list[EmailMessage] | None:
            return self.messages[:count] if len(self.messages) >= count else None

        return wait_for(arrived, timeout=timeout, what=f"{count} email(s)")


@contextmanager
def mail_receiving(login: tuple[str, str] | None = None) -> Iterator[Mailbox]:
    """A :class:`Mailbox` listening on 127.0.0.1 (no STARTTLS: it takes ``starttls = false``
    channels, and shows that a ``starttls = true`` one refuses to send in clear)."""
    mailbox = Mailbox(login=login)
    controller = Controller(
        mailbox,
        hostname="127.0.0.1",
        port=free_port(),
        authenticator=mailbox.authenticate if login else None,
        auth_require_tls=False,
    )
    controller.start()
    mailbox.port = controller.port
    try:
        yield mailbox
    finally:
        controller.stop()
