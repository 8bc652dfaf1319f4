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
from types import FrameType
from typing import Any

from trainvitals.agent.exit_hooks import signals_caught, take_signal_since, traceback_text
from trainvitals.protocol import EndReason

__all__ = ["FitCall"]


class FitCall:
    """The ``fit`` call running on this thread for ``model`` (see :meth:`find`)."""

    def __init__(self, frame: FrameType, thread: int) -> None:
        self._frame: FrameType | None = frame
        # The first frame outside Keras that leads to the call (Keras filters its own frames
        # out of the tracebacks it raises): an exception that left fit passed through it.
        caller = frame.f_back
        while caller is not None and _in_keras(caller):
            caller = caller.f_back
        self._caller: FrameType | None = caller
        self.thread = thread
        #: The exception the interactive shell kept last (``sys.last_value``) when fit began.
        self._shown_before = getattr(sys, "last_value", None)
        #: The SIGTERM/SIGINT the agent had caught when the call began.
        self._signal_mark = signals_caught()

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

    def argument(self, name: str) -> Any:
        """The value of ``fit``'s parameter ``name`` (None once forgotten)."""
        frame = self._frame
        return frame.f_locals.get(name) if frame is not None else None

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
        """Let go of the frames (and so of what ``fit`` held: the model, the data), and of
        the exception shown before."""
        self._frame = self._caller = self._shown_before = None

    def exception(self) -> BaseException | None:
        """The exception that left the call, where it can still be seen: the one the thread is
        handling now (its ``except`` or ``finally`` block), else the one an interactive shell
        (IPython, Jupyter) showed since the call began; only one whose traceback passes
        through the call's caller. None when the script caught it and moved on."""
        handled: Any = sys._current_exceptions().get(self.thread)
        candidates = [handled[1] if isinstance(handled, tuple) else handled]  # 3.11: exc_info
        shown = getattr(sys, "last_value", None)
        if shown is not self._shown_before:
            candidates.append(shown)
        for error in candidates:
            if isinstance(error, BaseException) and self._passed_through(error):
                return error
        return None

    def ending(self, error: BaseException | None) -> tuple[str, str | None]:
        """How the run of a call that ``error`` left ends, and the traceback to end it with:
        ``signal:SIGINT`` if Ctrl-C (a notebook's interrupt) came during the call, else
        ``exception``. A notebook's kernel may put its own SIGINT handler back around each
        cell, past the agent's: a KeyboardInterrupt says Ctrl-C as well."""
        reason = take_signal_since(self._signal_mark) or (
            EndReason.SIGINT if isinstance(error, KeyboardInterrupt) else EndReason.EXCEPTION
        )
        return reason, traceback_text(error) if error is not None else None

    def _passed_through(self, error: BaseException) -> bool:
        caller = self._caller
        entry = error.__traceback__
        while entry is not None:
            if entry.tb_frame is caller:
                return True
            entry = entry.tb_next
        return False


def _in_keras(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return isinstance(module, str) and (module == "keras" or module.startswith("keras."))
