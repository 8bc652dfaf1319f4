"""Whether the ``fit`` call that started a run still runs, asked from any thread.

Keras calls a callback's ``on_train_end`` only when ``fit`` returns. An exception that leaves
``fit`` skips it: Ctrl-C in a notebook, whose kernel lives on, or an out-of-memory error that
a script catches to try again at a smaller batch. The run would stay ``running`` (its sender
still sends heartbeats), and the model's train step would stay tapped. So the callback notes
the frame of the ``fit`` call that calls its ``on_train_begin``, and the sender's looks ask
whether that frame is still on the training thread's stack: a walk of a few dozen frames.
"""

from __future__ import annotations

import sys
import threading
import traceback
from types import FrameType
from typing import Any

__all__ = ["FitCall"]


class FitCall:
    """The ``fit`` call running on this thread for ``model`` (see :meth:`find`)."""

    def __init__(self, frame: FrameType, thread: int) -> None:
        self._frame: FrameType | None = frame
        self.thread = thread
        #: The exception the interactive shell kept last (``sys.last_value``) when fit began.
        self._shown_before = getattr(sys, "last_value", None)

    @classmethod
    def find(cls, model: Any) -> FitCall | None:
        """The innermost ``fit`` of ``model`` among the callers of the caller; None when the
        callbacks are called by a loop of the script's own."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
                return cls(frame, threading.get_ident())
            frame = frame.f_back
        return None

    def running(self) -> bool:
        """Whether the call is still on its thread's stack (any thread may ask)."""
        target = self._frame
        if target is None:
            return False
        frame = sys._current_frames().get(self.thread)
        while frame is not None:
            if frame is target:
                return True
            frame = frame.f_back
        return False

    def forget(self) -> None:
        """Let go of the frame (and so of what ``fit`` held: the model, the data)."""
        self._frame = None

    def exception_text(self) -> str | None:
        """The traceback of the exception that left the call, where it can still be seen: the
        one the thread is handling now (its ``except`` or ``finally`` block), else the one an
        interactive shell (IPython, Jupyter) showed since the call began; None when the script
        caught it and moved on."""
        handled: Any = sys._current_exceptions().get(self.thread)
        error = handled[1] if isinstance(handled, tuple) else handled  # 3.11: exc_info()'s
        if error is None:
            shown = getattr(sys, "last_value", None)
            error = shown if shown is not self._shown_before else None
        if not isinstance(error, BaseException):
            return None
        return "".join(traceback.format_exception(type(error), error, error.__traceback__))
