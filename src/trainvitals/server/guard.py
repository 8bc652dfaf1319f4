"""What every request must be before a route sees it: addressed to this server, from a page of
this server, and small.

One pure ASGI middleware, in front of everything (websockets included), so no route can forget
a check:

- **Host** (DNS rebinding): a page on ``evil.example`` whose name is made to resolve to
  127.0.0.1 reaches a loopback server with ``Host: evil.example``. Only the hosts the server
  is reached by are accepted: on a loopback address the loopback names; else the host of
  ``public_url`` and the listening address, or the hosts given with ``allowed_hosts``.
- **Origin** (cross-site requests and websockets): a browser names the page a request comes
  from. A request that names one must come from this server's own origin (or ``public_url``'s);
  agents and scripts send no ``Origin`` and are judged by their token alone.
- **Writes are JSON**: a form or a ``no-cors`` fetch can only send ``text/plain``, a form or
  multipart body without a preflight, so state-changing routes take ``application/json`` only.
- **Bodies over ``max_body_bytes``** get 413 before anything reads them.
- **Without auth, this machine only** (``local_only``): every request then speaks for an
  admin of every project, so one from another address is refused, whatever address the
  server listens on (``create_app`` run by hand on ``0.0.0.0``) and whatever ``Host`` it
  names. Behind a proxy on this machine, the address is the one the proxy forwards
  (``X-Forwarded-For``, which uvicorn trusts from loopback).

A refusal is a short plain answer (400, 403, 413 or 415); a websocket is closed before it is
accepted, which its client sees as a 403 answer to its handshake.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainvitals.protocol import CLOSE_POLICY_VIOLATION

#: Requests that change something; GET, HEAD and OPTIONS only read.
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
LOCAL_ONLY = (
    "this server runs without tokens (auth off) and answers this machine only: serve with "
    "--auth required and tokens to share it"
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack socket's IPv4 client: ::ffff:127.0.0.1
    return address.is_loopback


def allowed_hosts(bind: str, public_url: str | None, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` names a server listening on ``bind`` answers to; empty means any."""
    hosts = {h.lower() for h in extra if h}
    if "*" in hosts:
        return frozenset()
    if public_url:
        name = urlsplit(public_url).hostname
        if name:
            hosts.add(name.lower())
    if is_loopback(bind):
        return frozenset(hosts | LOOPBACK_NAMES)
    if bind not in ("0.0.0.0", "::", ""):
        hosts.add(bind.strip("[]").lower())
        return frozenset(hosts | LOOPBACK_NAMES)
    # Listening on every interface without being told the names: any Host (a team server
    # behind a proxy). ``--public-url`` or ``allowed_hosts`` narrows it.
    return frozenset(hosts | LOOPBACK_NAMES) if hosts else frozenset()


class RequestGuard:
    """The checks in this module's docstring, as ASGI middleware."""

    def __init__(
        self,
        app: ASGIApp,
        hosts: frozenset[str],
        public_url: str | None = None,
        max_body_bytes: int = 1 << 20,
        local_only: bool = False,
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.local_only = local_only
        self.public_origin = _origin_of(public_url) if public_url else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _refuse(scope, receive, send, *refusal)
            return
        if scope["type"] == "http" and scope["method"] in _WRITES:
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
                await _refuse(scope, receive, send, 413, "request body too large")
                return
            await self._with_limit(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _with_limit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body (a write's is small) and stop at the limit, whatever the headers
        said; the app then gets it whole, or never runs."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _refuse(scope, receive, send, 413, "request body too large")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        client = scope.get("client")  # None: a Unix socket's, this machine's
        if self.local_only and client is not None and not is_loopback(str(client[0])):
            return 403, LOCAL_ONLY
        host = _hostname(headers.get("host", ""))
        if self.hosts and host not in self.hosts:
            return 400, f"unknown host {host[:64]!r}"
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, scope, headers):
            return 403, "cross-origin request refused"
        if scope["type"] == "http" and scope["method"] in _WRITES:
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
            if has_body and kind != "application/json":
                return 415, "expected a JSON body (Content-Type: application/json)"
        return None

    def _same_origin(self, origin: str, scope: Scope, headers: dict[str, str]) -> bool:
        # An opaque origin ("null": a sandboxed frame any site can embed, a file opened from
        # disk) names no server: it is never this one, whatever else is unknown here.
        claimed = _origin_of(origin)
        if claimed is None:
            return False
        own = _origin_of(f"{_scheme(scope)}://{headers.get('host', '')}")
        return claimed in {own, self.public_origin}


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, reason: str) -> None:
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": CLOSE_POLICY_VIOLATION, "reason": reason})
        return
    body = reason.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                # The unread body is not drained: the connection ends with this answer.
                *([(b"connection", b"close")] if status == 413 else []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _scheme(scope: Scope) -> str:
    scheme = str(scope.get("scheme", "http"))
    return {"ws": "http", "wss": "https"}.get(scheme, scheme)


def _hostname(host: str) -> str:
    try:
        return (urlsplit(f"//{host}").hostname or "").lower()
    except ValueError:
        return ""


def _origin_of(url: str) -> tuple[str, str, int | None] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port
