"""The connections open on this server process: agents' by run, and every websocket by the
token that opened it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from starlette.websockets import WebSocket, WebSocketDisconnect

from trainvitals.protocol import CLOSE_POLICY_VIOLATION

__all__ = ["OpenRuns", "OpenTokens", "TokenSocket"]

log = logging.getLogger("trainvitals.server")

#: The reason a websocket of a revoked token is closed with (1008).
REVOKED = "this token was revoked"
#: What the key of a browser session's websockets begins with (``auth.session_key``): signing
#: out "revokes" it, and its websockets close with :data:`SIGNED_OUT`.
SESSION = "session:"
#: The reason a websocket of a browser session that signed out is closed with (1008).
SIGNED_OUT = "this browser session was signed out"
#: Seconds a revoke is remembered, for a websocket whose token was read just before it.
REMEMBER = 600.0


class OpenRuns:
    """The agent connections open on this process, by run: a watchdog, speaking for a run
    whose process died, numbers its ``end`` after every frame that process sent, and those
    may still be queued here, behind a loaded writer, when the watchdog says hello."""

    def __init__(self) -> None:
        self._open: dict[str, set[asyncio.Event]] = {}

    def opened(self, run_id: str) -> asyncio.Event:
        """A connection of ``run_id`` said hello; set the event it returns when it closes."""
        closed = asyncio.Event()
        self._open.setdefault(run_id, set()).add(closed)
        return closed

    def closed(self, run_id: str, event: asyncio.Event) -> None:
        """The connection whose event :meth:`opened` returned closed."""
        event.set()
        connections = self._open.get(run_id, set())
        connections.discard(event)
        if not connections:
            self._open.pop(run_id, None)

    async def drained(self, run_id: str, timeout: float) -> bool:
        """Wait until the connections of ``run_id`` open now have closed; False on timeout."""
        waiting = [event.wait() for event in self._open.get(run_id, ())]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*waiting)
        except TimeoutError:
            return False
        return True


class TokenSocket:
    """A websocket held by :class:`OpenTokens`: ``revoked`` once its token is, and closed."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        #: Its token was revoked: nothing more is sent on it (it is closed, or closing).
        self.revoked = False

    async def close(self, reason: str) -> None:
        # It may close itself meanwhile (the peer left): then there is nothing to close.
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await self.websocket.close(CLOSE_POLICY_VIOLATION, reason)


class OpenTokens:
    """The websockets open on this process, agents' and browsers', by the token that opened
    them: a token revoked (on any replica: the live hub carries it) closes them at once, as
    its browser sessions end, rather than when they next connect. A token revoked in the
    last :data:`REMEMBER` seconds closes a websocket that registers after the revoke (its
    token was read just before it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._open: dict[str, set[TokenSocket]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._clock = clock
        #: Tokens revoked lately: id -> when this process heard it.
        self._revoked: dict[str, float] = {}

    def opened(self, token_id: str, websocket: WebSocket) -> TokenSocket:
        """``websocket`` opened with ``token_id``; pass what this returns to :meth:`closed`."""
        socket = TokenSocket(websocket)
        self._open.setdefault(token_id, set()).add(socket)
        if token_id in self._revoked:
            self._close({socket}, token_id)
        return socket

    def closed(self, token_id: str, socket: TokenSocket) -> None:
        sockets = self._open.get(token_id, set())
        sockets.discard(socket)
        if not sockets:
            self._open.pop(token_id, None)

    def count(self, token_id: str) -> int:
        return len(self._open.get(token_id, ()))

    def revoked(self, token_id: str) -> int:
        """Close every websocket of ``token_id`` here (1008); how many there were."""
        now = self._clock()
        for old in [t for t, when in self._revoked.items() if now - when > REMEMBER]:
            del self._revoked[old]
        self._revoked[token_id] = now
        sockets = self._open.pop(token_id, set())
        self._close(sockets, token_id)
        if sockets and not token_id.startswith(SESSION):  # an operator's record: not sign-outs
            log.warning("token %s revoked: %d open connection(s) closed", token_id, len(sockets))
        return len(sockets)

    def _close(self, sockets: set[TokenSocket], key: str) -> None:
        reason = SIGNED_OUT if key.startswith(SESSION) else REVOKED
        for socket in sockets:
            socket.revoked = True  # from now on, before the close goes out
            task = asyncio.create_task(socket.close(reason), name="trainvitals-revoke")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
