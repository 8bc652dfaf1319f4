"""How the process's end reaches the runs it leaves open.

An uncaught exception skips Keras's ``on_train_end``. The interpreter calls ``sys.excepthook``
before atexit handlers, so the hook keeps the traceback and the atexit handler reports it.
SIGTERM's default action kills the process without running atexit handlers, so the signal
handler reports the ending first, then lets the signal do what it would have done.

A child forked from the training process (a data loader's worker, a pool's) gets the signals'
handlers as they were before trainvitals: its runs are its parent's. That handler is Python's,
which runs only between bytecodes, so a worker blocked in C code would outlive a SIGTERM; and
CPython drops a signal that reaches a child before its fork is complete (a Process.terminate()
right after start() left the worker alive and join() waiting forever). So the forking thread
holds the signals whose old handler is the default blocked across the fork; the child puts
the old handlers back, then lets them through: one sent meanwhile kills it, as it would have
without trainvitals. (A signal with a Python handler of the script's own is left to CPython.)
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Protocol

from trainvitals.protocol import EndReason, signal_reason

__all__ = ["finish_at_exit", "forget", "signals_caught", "take_signal_since", "traceback_text"]


class Finishing(Protocol):
    """What the exit hooks end: a :class:`~trainvitals.agent.run.Run`."""

    def finish(
        self, reason: str = ..., traceback_text: str | None = ..., timeout: float = ...
    ) -> bool: ...


_open_runs: weakref.WeakSet[Finishing] = weakref.WeakSet()
_uncaught: list[str] = []
_signals: list[str] = []
#: How many of ``_signals`` the process got over (take_signal_since): not why it exits.
_signals_forgotten = 0
_hooks_installed = False
#: The signals given trainvitals' handler: the handler before it, and trainvitals'.
_chained: dict[int, tuple[Any, Callable[[int, FrameType | None], None]]] = {}
#: The forking thread's signal mask before :func:`_hold_signals`, put back after the fork.
_masks = threading.local()


def finish_at_exit(run: Finishing) -> None:
    """End ``run`` with the process if nothing ends it before: at exit, at an uncaught
    exception (with its traceback), at SIGTERM or SIGINT (the hooks are installed once)."""
    _install()
    _open_runs.add(run)


def forget(run: Finishing) -> None:
    """``run`` has ended: the process's end is none of its business."""
    _open_runs.discard(run)


def traceback_text(error: BaseException) -> str:
    """``error``'s traceback as Python prints it: what an ``end`` frame carries."""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def signals_caught() -> int:
    """How many SIGTERM/SIGINT the agent's handlers have seen in this process: a mark for
    :func:`take_signal_since`."""
    return len(_signals)


def take_signal_since(mark: int) -> str | None:
    """The end reason of the last signal seen since :func:`signals_caught` returned ``mark``
    (``"signal:SIGINT"``: Ctrl-C, or a notebook's interrupt), if any; it and those before it
    since ``mark`` are forgotten: the process got over them, and they are not the reason it
    later exits for."""
    global _signals_forgotten
    if len(_signals) <= mark:
        return None
    _signals_forgotten = len(_signals)
    return _signals[-1]


def _install() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous = sys.excepthook

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        _uncaught.append(traceback_text(value))
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(_finish_open_runs)
    if threading.current_thread() is threading.main_thread():  # signals live there only
        for signum in (signal.SIGTERM, signal.SIGINT):
            _chain_signal(signum)
        if _chained and hasattr(os, "register_at_fork"):
            os.register_at_fork(
                before=_hold_signals, after_in_parent=_let_signals_in, after_in_child=_unchain
            )


def _signals_held_across_fork() -> list[int]:
    """The signals held across a fork: those whose handler before the agent's was the default
    (the kernel's, which kills a process at once). One with a Python handler is left to
    CPython as it would be without the agent: let in inside the child's at-fork hooks, its
    handler would run there, and its exception (SystemExit, KeyboardInterrupt) be dropped."""
    return [signum for signum, (previous, _) in _chained.items() if previous == signal.SIG_DFL]


def _hold_signals() -> None:
    _masks.before = signal.pthread_sigmask(signal.SIG_BLOCK, _signals_held_across_fork())


def _let_signals_in() -> None:
    before = getattr(_masks, "before", None)
    _masks.before = None
    if before is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _unchain() -> None:
    """In a forked child: the handlers from before trainvitals (where the script has not put
    its own since), then the signals held let in."""
    try:
        for signum, (previous, ours) in _chained.items():
            if signal.getsignal(signum) is ours:
                signal.signal(signum, previous)
    finally:
        _let_signals_in()
        _chained.clear()


def _chain_signal(signum: int) -> None:
    previous = signal.getsignal(signum)
    if previous in (signal.SIG_IGN, None):
        return

    def handler(number: int, frame: FrameType | None) -> None:
        _signals.append(signal_reason(signal.Signals(number).name))
        if previous == signal.SIG_DFL:
            _finish_open_runs()
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)  # end as the signal would have ended it
        elif callable(previous):
            previous(number, frame)  # e.g. SIGINT's KeyboardInterrupt: the script may catch it

    signal.signal(signum, handler)
    _chained[signum] = (previous, handler)


def _finish_open_runs() -> None:
    text = _uncaught[-1] if _uncaught else None
    recent = _signals[-1] if len(_signals) > _signals_forgotten else None
    reason = recent or (EndReason.EXCEPTION if text else EndReason.EXITED)
    for run in list(_open_runs):
        run.finish(reason, text, timeout=5.0)
