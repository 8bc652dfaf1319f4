"""The ingest websocket as the agent speaks it: open it, say hello, read acks.

The :class:`~trainvitals.agent.transport.Sender` and ``trainvitals sync``
(:mod:`trainvitals.agent.sync`) both deliver frames over it; :data:`UNREACHABLE` names the
errors after which both try again later.
"""

from __future__ import annotations

import itertools
import json
import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection, connect

from trainvitals.exceptions import ProtocolError
from trainvitals.json_types import JsonObject
from trainvitals.protocol import ACK, FEATURE_CLOCKS, MAX_FRAME_BYTES, WELCOME, HelloFrame

if TYPE_CHECKING:
    from websockets.typing import DataLike  # websockets 15 and later


class KeepaliveConnection(ClientConnection):
    """A client connection whose keepalive pings carry a count, not a random payload.

    websockets (15 and later) draws each ping's payload from :mod:`random`'s shared generator,
    which in the training process is the user's: seeded by ``keras.utils.set_random_seed``, and
    the source of every unseeded Keras initializer's seed. The connection's keepalive thread
    pings every 20 s, which would make a seeded run's layers built after that (a fine-tuning
    head) differ from run to run. A payload only has to differ from those of the pings awaiting
    a pong: a count wraps after 2**32 pings, some 2,700 years of keepalives.
    """

    _count = itertools.count(1)

    def ping(self, data: DataLike | None = None, **options: Any) -> threading.Event:
        if data is None:
            data = struct.pack("!I", next(self._count) % 2**32)
        return super().ping(data, **options)


#: Errors that say the server cannot be reached or spoke wrongly: worth retrying later.
UNREACHABLE = (OSError, TimeoutError, ConnectionClosed, InvalidHandshake, ProtocolError)


class _Keepalive(TypedDict, total=False):
    ping_interval: float  # passed only when set: websockets keeps its own default otherwise


def connect_ingest(url: str, token: str | None, keepalive: float | None = None) -> ClientConnection:
    """Open an ingest websocket to ``url``, sending ``token`` as a bearer token if set;
    ``keepalive``: seconds between keepalive pings (default: websockets' own, 20 s)."""
    options: _Keepalive = {} if keepalive is None else {"ping_interval": keepalive}
    connection: ClientConnection = connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"} if token else {},
        open_timeout=5,
        close_timeout=2,
        max_size=MAX_FRAME_BYTES,
        compression=None,  # JSON floats compress poorly; spare the training process's CPU
        create_connection=KeepaliveConnection,
        **options,
    )
    return connection


@dataclass(frozen=True)
class Welcome:
    """What the server's ``welcome`` tells the agent."""

    #: The last seq of the run the server stored: frames up to it are not sent again.
    last_seq: int
    #: Whether it reads ``points`` frames whose series share clocks (``FEATURE_CLOCKS``).
    clocks: bool
    #: Issued in the run's first welcome, to send in every later hello; else None.
    run_secret: str | None


def greet(ws: ClientConnection, hello: HelloFrame) -> Welcome:
    """Send the run's ``hello`` and return what the server's ``welcome`` says."""
    ws.send(json.dumps(hello))
    welcome = decode(ws.recv(timeout=10))
    if welcome.get("type") != WELCOME:
        raise ProtocolError(f"Expected a 'welcome' frame, but got {welcome!r}")
    features, secret = welcome.get("features"), welcome.get("run_secret")
    return Welcome(
        last_seq=_seq(welcome, "last_seq", default=0),
        clocks=isinstance(features, list) and FEATURE_CLOCKS in features,
        run_secret=secret if isinstance(secret, str) and secret else None,
    )


def read_ack(ws: ClientConnection, timeout: float) -> int:
    """The seq of the next ``ack`` the server sends; TimeoutError if none comes within
    ``timeout`` s. Frames of other kinds (an ``alert``) are passed over."""
    deadline = time.monotonic() + timeout
    while True:
        frame = decode(ws.recv(timeout=max(0.0, deadline - time.monotonic())))
        if frame.get("type") == ACK:
            return ack_seq(frame)


def ack_seq(ack: JsonObject) -> int:
    """The seq an ``ack`` frame acknowledges (every frame up to it is stored)."""
    return _seq(ack, "seq")


def _seq(frame: JsonObject, key: str, default: int | None = None) -> int:
    value = frame.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"Expected a whole number as {key!r}, but got {frame!r}")
    return value


def decode(message: str | bytes) -> JsonObject:
    """A frame from the server: a JSON object, else :class:`ProtocolError`."""
    try:
        frame = json.loads(message)
    except ValueError as exc:
        raise ProtocolError(f"Expected a JSON frame from the server, got {message[:80]!r}") from exc
    if not isinstance(frame, dict):
        raise ProtocolError(f"Expected a JSON object from the server, got {frame!r}")
    return frame
