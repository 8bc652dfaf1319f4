"""What a request that fails gets: a 4xx with a safe message, or 503 while the database
cannot store; never a 500 and a traceback for something a client sent.

FastAPI's own 422 renders each error's ``input`` (on sign-in, the token itself), and fails
with a 500 on an input JSON cannot render (``1e999`` read as infinity, a lone UTF-16
surrogate). Here the errors are rendered without their input, and a body whose JSON holds a
non-finite number or a lone surrogate is refused as it is parsed (:class:`StrictJSONRoute`).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy import exc as sa
from starlette.requests import Request
from starlette.responses import Response

from trainvitals.exceptions import StorageUnavailable, WriterClosed
from trainvitals.protocol import UNSAFE_CHARS
from trainvitals.server.writer import is_outage

__all__ = ["StrictJSONRoute", "install", "safe_text"]

log = logging.getLogger("trainvitals.server")

#: Seconds a client is asked to wait before trying again while the database cannot store.
RETRY_AFTER = 5
#: Errors of one 422 answer rendered (a list of 10,000 bad items need not make 10,000).
_MAX_ERRORS = 20
#: Characters that must not reach a log line or a terminal as they are: those no name may
#: hold, and lone surrogates.
UNSAFE = re.compile(rf"[{UNSAFE_CHARS}\ud800-\udfff]")


def safe_text(text: str, limit: int = 200) -> str:
    """``text`` with every :data:`UNSAFE` character escaped (``\\u2028``), cut at ``limit``."""
    escaped = UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def _location(loc: Sequence[Any]) -> list[int | str]:
    return [part if isinstance(part, int) else safe_text(str(part), 64) for part in loc[:10]]


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "type": safe_text(str(error.get("type", "")), 64),
            "loc": _location(error.get("loc", ())),
            "msg": safe_text(str(error.get("msg", ""))),
        }
        for error in exc.errors()[:_MAX_ERRORS]
    ]
    return JSONResponse({"detail": errors}, status_code=422)


def _try_later(reason: str) -> Response:
    return JSONResponse(
        {"detail": f"{reason}: try again later"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER)},
    )


async def _unavailable(request: Request, exc: Exception) -> Response:
    if isinstance(exc, WriterClosed):
        return _try_later("the server is shutting down")
    return _try_later("the database cannot store now")


async def _database(request: Request, exc: Exception) -> Response:
    if not is_outage(exc):
        raise exc  # a bug: the server's own 500, with its traceback in the log
    log.warning("%s %s: the database is unreachable", request.method, request.url.path)
    return _try_later("the database is unreachable")


def install(app: FastAPI) -> None:
    """Answer validation errors safely, and database outages with 503 and ``Retry-After``."""
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StorageUnavailable, _unavailable)
    app.add_exception_handler(WriterClosed, _unavailable)
    for outage in (sa.DBAPIError, sa.DisconnectionError, sa.TimeoutError, sa.PendingRollbackError):
        app.add_exception_handler(outage, _database)


def _refused(reason: str) -> HTTPException:
    """A JSON body that parses but that no route can take: 400, saying why (FastAPI passes an
    ``HTTPException`` from parsing through)."""
    return HTTPException(400, f"malformed JSON body: {reason}")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _refused("a number too large for a 64-bit float")
    return number


def _no_constants(name: str) -> Any:
    raise _refused(f"{name} is not JSON")


def _checked(value: Any) -> Any:
    """``value`` when no string in it holds a lone surrogate (it could not be stored or
    rendered as UTF-8)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                raise _refused("a lone UTF-16 surrogate is not text") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


class _StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = _checked(
                json.loads(body, parse_float=_finite, parse_constant=_no_constants)
            )
        return self._json


class StrictJSONRoute(APIRoute):
    """A route whose JSON body is parsed strictly: ``NaN``, ``Infinity``, a number beyond a
    float (``1e999``) and a lone surrogate (``"\\ud800"``) are refused with a 400 before any
    model sees them, as is a body nested too deep to parse (a ``RecursionError``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictRequest(request.scope, request.receive))

        return strict
