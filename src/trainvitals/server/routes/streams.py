"""Websocket routes: ``/api/v1/ingest`` for agents, ``/api/v1/live`` for browsers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from trainvitals.exceptions import IngestRejected
from trainvitals.protocol import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_POLICY_VIOLATION,
    CLOSE_TRY_AGAIN_LATER,
    CLOSE_UNSUPPORTED_DATA,
    INGEST_PATH,
    LIVE_PATH,
)
from trainvitals.server.auth import identify
from trainvitals.server.deps import StateDep
from trainvitals.server.ingest import IngestSession
from trainvitals.server.live import Subscriber
from trainvitals.server.storage.tokens import Role

log = logging.getLogger("trainvitals.server")
router = APIRouter()

NO_TOKEN = "a token is required: 'Authorization: Bearer <token>', or sign in"
#: A websocket close reason may hold at most 123 bytes (RFC 6455, 5.5).
_MAX_REASON = 123


@router.websocket(INGEST_PATH)
async def ingest(websocket: WebSocket, state: StateDep) -> None:
    await websocket.accept()
    who = await asyncio.to_thread(identify, websocket)
    if who is None:
        await websocket.close(CLOSE_POLICY_VIOLATION, _reason(NO_TOKEN))
        return
    try:
        state.quotas.connect(who.token_id)
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
    )
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
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                raise IngestRejected(
                    CLOSE_UNSUPPORTED_DATA, "expected JSON text frames, got a binary frame"
                )
            reply = await session.handle(text)
            if reply is not None:
                await websocket.send_text(reply)
    except IngestRejected as exc:
        run = session.run["id"] if session.run else "unknown run"
        log.warning("closing ingest connection (%s): %d %s", run, exc.code, exc.reason)
        await websocket.close(code=exc.code, reason=_reason(exc.reason))
    except WebSocketDisconnect:
        return
    finally:
        state.quotas.disconnect(who.token_id)


@router.websocket(LIVE_PATH)
async def live(websocket: WebSocket, state: StateDep) -> None:
    """Browser stream. Send ``{"type": "subscribe", "run_id": ...}`` to get a run's points;
    every browser gets run-list changes."""
    await websocket.accept()
    who = await asyncio.to_thread(identify, websocket)
    if who is None or not who.may(Role.READ):
        await websocket.close(CLOSE_POLICY_VIOLATION, _reason(NO_TOKEN))
        return
    subscriber = state.hub.subscribe(who.projects)
    sender = asyncio.create_task(_drain(websocket, subscriber))
    try:
        while True:
            raw = await websocket.receive_text()
            try:
                request = json.loads(raw)
                kind, run_id = request["type"], str(request["run_id"])
            except (ValueError, KeyError, TypeError):
                await websocket.close(
                    CLOSE_INVALID_PAYLOAD,
                    _reason('expected {"type": "subscribe"|"unsubscribe", "run_id": ...}'),
                )
                return
            if kind == "subscribe":
                if who.projects is not None:  # only the runs of the project it sees
                    run = await asyncio.to_thread(state.store.runs.get_run, run_id, False)
                    if run is None or run["project"] != who.projects:
                        continue
                subscriber.runs.add(run_id)
            elif kind == "unsubscribe":
                subscriber.runs.discard(run_id)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        state.hub.unsubscribe(subscriber)
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def _drain(websocket: WebSocket, subscriber: Subscriber) -> None:
    overflow = asyncio.create_task(subscriber.overflowed.wait())
    try:
        while True:
            get = asyncio.create_task(subscriber.queue.get())
            done, _ = await asyncio.wait({get, overflow}, return_when=asyncio.FIRST_COMPLETED)
            if overflow in done:
                get.cancel()
                await websocket.close(CLOSE_TRY_AGAIN_LATER, "too slow to follow the live stream")
                return
            message = get.result()
            subscriber.taken(message)
            await websocket.send_text(message)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        overflow.cancel()


def _reason(text: str) -> str:
    encoded = text.encode()
    if len(encoded) <= _MAX_REASON:
        return text
    return encoded[: _MAX_REASON - 3].decode(errors="ignore") + "..."
