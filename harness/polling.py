"""Polling for a condition with a timeout, the tests' one way to wait (never a bare sleep).

:func:`wait_for` polls from a thread, :func:`wait_for_async` from a coroutine on an event loop
(whose other tasks it must let run); both take the same arguments and fail the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


class _Poll:
    """One wait's deadline, and the last error its condition raised (told on a timeout)."""

    def __init__(self, timeout: float, what: str, condition: object) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.what = what or repr(condition)
        self.last_error: Exception | None = None

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def timed_out(self) -> AssertionError:
        error = f" (last error: {self.last_error!r})" if self.last_error else ""
        return AssertionError(f"timed out after {self.timeout} s waiting for {self.what}{error}")


def wait_for(
    condition: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; fail after
    ``timeout`` seconds. An exception from ``condition`` counts as not yet (the system may not
    be ready): the last one is told in the failure."""
    poll = _Poll(timeout, what, condition)
    while poll.running():
        try:
            value = condition()
        except Exception as exc:
            poll.last_error = exc
        else:
            if value:
                return value
        time.sleep(interval)
    raise poll.timed_out()


@overload
async def wait_for_async(
    condition: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def wait_for_async(
    condition: Callable[[], T | None], timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


async def wait_for_async(
    condition: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "",
) -> object:
    """:func:`wait_for` on an event loop: ``condition`` may be a coroutine function, and
    between two polls the loop's other tasks run."""
    poll = _Poll(timeout, what, condition)
    while poll.running():
        try:
            polled = condition()
            value = await polled if inspect.isawaitable(polled) else polled
        except Exception as exc:
            poll.last_error = exc
        else:
            if value:
                return value
        await asyncio.sleep(interval)
    raise poll.timed_out()
