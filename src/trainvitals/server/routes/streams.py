"""Websocket routes: ``/api/v1/ingest`` for agents, ``/api/v1/live`` for browsers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from trainvitals.exceptions import IngestRejected, StorageUnavailable, WriterClosed
from trainvitals.protocol import (
    CLOSE_INTERNAL_ERROR,
    CLOSE_INVALID_PAYLOAD,
    CLOSE_POLICY_VIOLATION,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN_LATER,
    CLOSE_UNSUPPORTED_DATA,
    INGEST_PATH,
    LIVE_PATH,
)
from trainvitals.server.auth import LOCAL, identify, session_key
from trainvitals.server.connections import TokenSocket
from trainvitals.server.deps import AppState, StateDep
from trainvitals.server.ingest import IngestSession
from trainvitals.server.live import Subscriber
from trainvitals.server.storage.tokens import Principal, Role
from trainvitals.server.writer import is_outage

log = logging.getLogger("trainvitals.server")
router = APIRouter()

STORAGE_DOWN = "the server's database cannot store now: try again later"
NO_TOKEN = "a token is required: 'Authorization: Bearer <token>', or sign in"
BINARY_FRAME = "expected JSON text frames, got a binary frame"
#: What a browser may send on the live websocket: small requests, for runs that can exist.
_MAX_LIVE_REQUEST = 1024
_MAX_SUBSCRIPTIONS = 256
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # as a hello's run_id (server/schemas.py)
#: A websocket close reason may hold at most 123 bytes (RFC 6455, 5.5).
_MAX_REASON = 123


async def _admitted(websocket: WebSocket, state: AppState, role: Role) -> Principal | None:
    """Who ``websocket`` speaks for, checked before the upgrade: a request without a valid
    token, or whose token has ``role`` on no project, gets an HTTP 401 or 403 and no 101, so
    it can send nothing (not even one frame for the server to read); beyond
    ``max_websockets`` open on this process, 503. Once accepted, it counts in
    ``state.websockets`` until its handler takes it off."""
    if state.websockets >= state.settings.max_websockets:
        await _deny(websocket, 503, "too many connections to this server: try again later")
        return None
    try:
        who = await asyncio.to_thread(identify, websocket)
    except Exception as exc:
        if not is_outage(exc):
            raise
        await _deny(websocket, 503, "the database is unreachable: try again later")
        return None
    if who is None:
        await _deny(websocket, 401, NO_TOKEN)
        return None
    if not who.may(role):
        await _deny(websocket, 403, f"this token's role ({who.role}) may not {role} here")
        return None
    await websocket.accept()
    state.websockets += 1
    return who


async def _deny(websocket: WebSocket, status: int, detail: str) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        response = JSONResponse({"detail": detail}, status_code=status, headers=headers)
        await websocket.send_denial_response(response)
    else:  # closed before it is accepted: the server answers 403
        await websocket.close(CLOSE_POLICY_VIOLATION, _reason(detail))


@router.websocket(INGEST_PATH)
async def ingest(websocket: WebSocket, state: StateDep) -> None:
    who = await _admitted(websocket, state, Role.INGEST)
    if who is None:
        return
    # Held from the moment its token is known: a revoke from then on closes it.
    socket = state.open_tokens.opened(who.token_id, websocket)
    try:
        await _ingest(websocket, state, who, socket)
    finally:
        state.open_tokens.closed(who.token_id, socket)
        state.websockets -= 1


async def _ingest(
    websocket: WebSocket, state: AppState, who: Principal, socket: TokenSocket
) -> None:
    try:
        slot = await state.quotas.connect(who.token_id)
    except IngestRejected as exc:
        await websocket.close(code=exc.code, reason=_reason(exc.reason))
        return
    session = IngestSession(
        state.store,
        state.writer,
        state.hub,
        state.liveness,
        state.alerts,
        state.settings.max_frame_bytes,
        who,
        state.quotas,
        state.metrics,
        state.open_runs,
    )
    state.metrics.agents.inc()
    # The run's alerts, to an agent that takes them: sent from a task of their own.
    listening: tuple[str, Subscriber, asyncio.Task[None]] | None = None
    try:
        while True:
            if session.run is None:  # a connection that never says hello holds nothing
                try:
                    message = await asyncio.wait_for(
                        websocket.receive(), state.settings.hello_timeout
                    )
                except TimeoutError:
                    raise IngestRejected(
                        CLOSE_POLICY_VIOLATION,
                        f"expected a 'hello' within {state.settings.hello_timeout:g} s",
                    ) from None
            else:
                message = await websocket.receive()
            if message["type"] == "websocket.disconnect" or socket.revoked:
                return  # a frame that arrived after its token was revoked is not read
            text = message.get("text")
            if text is None:
                raise IngestRejected(CLOSE_UNSUPPORTED_DATA, BINARY_FRAME)
            reply = await session.handle(text)
            if who is not LOCAL:  # an agent streaming for days uses its token all along
                state.store.tokens.uses.note(who.token_id)
            if socket.revoked:  # closed meanwhile: its token was revoked
                return
            if reply is not None:
                await websocket.send_text(reply)
            if listening is None and session.hears_alerts and session.run is not None:
                run_id = session.run["id"]
                listener = state.hub.agent_listens(run_id)
                listening = (run_id, listener, asyncio.create_task(_drain(websocket, listener)))
    except IngestRejected as exc:
        if socket.revoked:
            return
        run = session.run["id"] if session.run else "unknown run"
        log.warning("closing ingest connection (%s): %d %s", run, exc.code, exc.reason)
        await websocket.close(code=exc.code, reason=_reason(exc.reason))
    except WebSocketDisconnect:
        return
    except (StorageUnavailable, WriterClosed) as exc:
        # Not stored, so not acknowledged: the agent reconnects and sends it again.
        reason = "the server is stopping" if isinstance(exc, WriterClosed) else STORAGE_DOWN
        await _close(websocket, CLOSE_TRY_AGAIN_LATER, reason)
    except Exception as exc:
        if is_outage(exc):  # a read for the hello, on a connection of the pool
            await _close(websocket, CLOSE_TRY_AGAIN_LATER, STORAGE_DOWN)
            return
        run = session.run["id"] if session.run else "unknown run"
        log.exception("ingest connection (%s) failed: closing it with 1011", run)
        await _close(websocket, CLOSE_INTERNAL_ERROR, "the server failed on this frame")
    finally:
        if listening is not None:
            run_id, listener, telling = listening
            state.hub.agent_left(run_id, listener)
            telling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await telling
        session.close()
        state.metrics.agents.dec()
        state.quotas.disconnect(who.token_id, slot)


@router.websocket(LIVE_PATH)
async def live(websocket: WebSocket, state: StateDep) -> None:
    """Browser stream. Send ``{"type": "subscribe", "run_id": ...}`` to get a run's points;
    every browser gets run-list changes. ``?clocks=1``: points with their clocks."""
    who = await _admitted(websocket, state, Role.READ)
    if who is None:
        return
    socket = state.open_tokens.opened(who.token_id, websocket)
    # A browser's session too: signing out closes its stream, not only revoking its token.
    session = session_key(websocket) if who is not LOCAL else None
    in_session = state.open_tokens.opened(session, websocket) if session else None
    # ?clocks=1: points in the agent frame's layout, steps and times once (docs/protocol.md).
    clocks = websocket.query_params.get("clocks") == "1"
    subscriber = state.hub.subscribe(who.projects, clocks=clocks)
    sender = asyncio.create_task(_drain(websocket, subscriber))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:  # receive_text() would raise a KeyError: a traceback, no close code
                await websocket.close(CLOSE_UNSUPPORTED_DATA, BINARY_FRAME)
                return
            if len(raw) > _MAX_LIVE_REQUEST:  # a browser's requests are a few dozen bytes
                await websocket.close(CLOSE_TOO_BIG, "live requests are at most 1 KiB")
                return
            request = _live_request(raw)
            if request is None:
                await websocket.close(
                    CLOSE_INVALID_PAYLOAD,
                    _reason('expected {"type": "subscribe"|"unsubscribe", "run_id": ...}'),
                )
                return
            kind, run_id = request
            if kind == "subscribe" and len(subscriber.runs) >= _MAX_SUBSCRIPTIONS:
                await websocket.close(
                    CLOSE_POLICY_VIOLATION, f"at most {_MAX_SUBSCRIPTIONS} runs a connection"
                )
                return
            if kind == "subscribe":
                if who.projects is not None:  # only the runs of the project it sees
                    run = await asyncio.to_thread(
                        state.store.runs.get_run, run_id, job=False, metrics=False
                    )
                    if run is None or run["project"] != who.projects:
                        continue
                state.hub.watch(subscriber, run_id)
            elif kind == "unsubscribe":
                state.hub.unwatch(subscriber, run_id)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        state.websockets -= 1
        state.open_tokens.closed(who.token_id, socket)
        if session and in_session is not None:
            state.open_tokens.closed(session, in_session)
        state.hub.unsubscribe(subscriber)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def _drain(websocket: WebSocket, subscriber: Subscriber) -> None:
    overflow = asyncio.create_task(subscriber.overflowed.wait())
    get: asyncio.Task[str] | None = None
    try:
        while True:
            get = asyncio.create_task(subscriber.queue.get())
            done, _ = await asyncio.wait({get, overflow}, return_when=asyncio.FIRST_COMPLETED)
            if overflow in done:
                get.cancel()
                reason = (
                    "live messages were lost on the way: reconnect and reload"
                    if subscriber.interrupted
                    else "too slow to follow the live stream"
                )
                await websocket.close(CLOSE_TRY_AGAIN_LATER, reason)
                return
            message = get.result()
            subscriber.taken(message)
            await websocket.send_text(message)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        overflow.cancel()
        if get is not None:
            get.cancel()  # cancelled with this task, the wait leaves it pending


def _live_request(raw: str) -> tuple[str, str] | None:
    """``(kind, run_id)`` of a browser's request, or None when it is not one."""
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: a kilobyte of "[[[[..."
        return None
    if not isinstance(request, dict):
        return None
    kind, run_id = request.get("type"), request.get("run_id")
    if kind not in ("subscribe", "unsubscribe") or not isinstance(run_id, str):
        return None
    return (kind, run_id) if _RUN_ID.fullmatch(run_id) else None


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    # The peer may have gone meanwhile: then there is nothing to close.
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await websocket.close(code, _reason(reason))


def _reason(text: str) -> str:
    encoded = text.encode()
    if len(encoded) <= _MAX_REASON:
        return text
    return encoded[: _MAX_REASON - 3].decode(errors="ignore") + "..."
