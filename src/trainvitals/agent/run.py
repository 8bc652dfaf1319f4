"""A run: the link between one training process and the server.

:class:`Run` is what :class:`~trainvitals.VitalsCallback` (and custom loops) record into.
It owns the point buffer and the sender thread, and makes sure the server hears how the
run ended, even when the script dies of an uncaught exception (:mod:`.exit_hooks`).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from trainvitals.agent import environment, exit_hooks
from trainvitals.agent.buffer import PointBuffer
from trainvitals.agent.config import AgentConfig
from trainvitals.agent.console import AlertLog, announce
from trainvitals.agent.gpu import NvmlSource, TfAllocatorSource
from trainvitals.agent.host import HostSource
from trainvitals.agent.sampler import Sampler, Source
from trainvitals.agent.spool import PendingFrames, Spool
from trainvitals.agent.stall import StallDetector, thread_stacks
from trainvitals.agent.sync import spool_meta, sync_in_background
from trainvitals.agent.transport import Sender
from trainvitals.agent.urgency import Urgency
from trainvitals.agent.watchdog import Watchdog
from trainvitals.protocol import (
    ACCEPTS_ALERTS,
    AUTOPSY,
    HELLO,
    PROTOCOL_VERSION,
    STALL,
    EndReason,
    HelloFrame,
    SeqColumns,
    whole_micros,
)

log = logging.getLogger("trainvitals")

#: How long ``finish`` waits for the server to acknowledge the last frames.
FLUSH_TIMEOUT = 10.0
#: ... and how long when the server is known to be unreachable.
UNREACHABLE_FLUSH_TIMEOUT = 2.0


class Run:
    """One training run streaming to a trainvitals server.

    Args:
        config: where to send and what to call the run (see
            :func:`trainvitals.agent.config.resolve`).
        system_metrics: seconds between host/GPU samples (default 1); 0 or False turns the
            sampler off.
        gpu: a GPU source to sample instead of NVML (e.g.
            :class:`trainvitals.agent.gpu.SimulatedGpu`).
        env: more facts for the run's environment (the callback adds TensorFlow's).
        watchdog: start the watchdog process that reports SIGKILL, OOM kills and segfaults,
            which the process cannot report itself (default True).
        on_system: called on the sampler thread with ``(step, time, values)`` after each
            host/GPU sample (the agent's own protective actions watch memory this way).
        notebook: show the run inline in a notebook (default: yes, unless
            ``TRAINVITALS_NOTEBOOK=0``); elsewhere the start prints the run's link.

    Example:
        >>> run = Run(resolve(project="mnist"))          # doctest: +SKIP
        >>> run.start()
        >>> run.log(step=1, values={"loss": 0.7})
        >>> run.finish()
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        system_metrics: float | bool = 1.0,
        gpu: Source | None = None,
        env: Mapping[str, Any] | None = None,
        watchdog: bool = True,
        on_system: Callable[[int, float, Mapping[str, float]], None] | None = None,
        notebook: bool | None = None,
    ) -> None:
        self.config = config
        self._notebook = notebook
        self._on_system = on_system
        self.id = uuid.uuid4().hex
        self.started_at = time.time()
        self._stall = StallDetector(config.stall_factor, config.stall_floor)
        self._urgency = Urgency()
        self._buffer = PointBuffer(
            on_step=lambda steps, at: self._stall.step(
                time.monotonic() if at is None else at, steps
            )
        )
        self._sender: Sender | None = None
        self._sampler: Sampler | None = None
        self._interval = 0.0 if system_metrics is False else float(system_metrics)
        self._gpu = gpu
        self._env = dict(env or {})
        self._use_watchdog = watchdog
        self._watchdog: Watchdog | None = None
        self._finished = False
        self._kept = False  # what the server did not acknowledge is on disk
        self._pid = os.getpid()  # the process that started the run: the one that ends it
        self._lock = threading.Lock()
        self._tick_hooks: list[Callable[[], None]] = []
        #: Binds the run to this process on the server: every hello carries it, the
        #: watchdog's included, and no other client can speak for the run without it.
        self._secret = secrets.token_urlsafe(24)

    @property
    def last_step(self) -> int:
        return self._buffer.last_step

    @property
    def here(self) -> bool:
        """Whether this is the process that started the run, not a child forked from it."""
        return os.getpid() == self._pid

    def hello(self) -> HelloFrame:
        return {
            "type": HELLO,
            "v": PROTOCOL_VERSION,
            "run_id": self.id,
            "project": self.config.project,
            "name": self.config.run_name,
            "config": _jsonable(self.config.config),
            "host": environment.host(),
            "pid": os.getpid(),
            "started_at": self.started_at,
            "env": {**environment.describe(), **self._env},
            "job": environment.job(),
            "process": environment.process(),
            "run_secret": self._secret,
            "accepts": [ACCEPTS_ALERTS],
        }

    def start(self) -> None:
        """Start the sender (and sampler) threads. Returns at once, server up or not."""
        if self._interval > 0:
            sources = system_sources(self._gpu)
            for source in sources:
                self._env[source.name] = _jsonable(source.describe())
            self._sampler = Sampler(sources, self._record_system, self._interval)
        hello = self.hello()
        url = self.config.run_ingest_url(self.id)
        spool = Spool(
            self.config.spool_dir,
            self.id,
            self.config.spool_max_bytes,
            meta=spool_meta(self.config.server, hello),
        )
        self._sender = Sender(
            url,
            hello,
            self._buffer,
            flush_interval=self.config.flush_interval,
            read_interval=self.config.read_interval,
            token=self.config.token,
            heartbeat_interval=self.config.heartbeat_interval,
            tick=self._tick,
            on_done=self._release_watchdog,
            on_message=AlertLog(self.config.server),
            pending=PendingFrames(self.config.spool_after_bytes, spool),
        )
        self._sender.start()
        sync_in_background(self.config, spool)  # what earlier processes left undelivered
        if self._use_watchdog:
            try:
                self._watchdog = Watchdog(url, hello, self.config.token)
            except OSError as exc:
                log.warning(
                    "trainvitals: no watchdog (%s): a SIGKILL or OOM kill will show as a lost run",
                    exc,
                )
        if self._sampler is not None:
            self._sampler.start()
        self._pid = os.getpid()
        exit_hooks.finish_at_exit(self)
        announce(self.config.server, self.id, self.config.run_name, self._notebook)

    def log(self, step: int, values: Mapping[str, float], time_: float | None = None) -> None:
        """Record ``values`` at ``step`` (at ``time_``, default now to the microsecond): cheap,
        never blocks on the network."""
        self._buffer.add(step, whole_micros(time.time()) if time_ is None else time_, values)
        self._hurry(self._urgency.values_are_urgent(values))

    def add_columns(
        self, columns: Mapping[str, SeqColumns], clock: Sequence[tuple[int, float]] = ()
    ) -> None:
        """Record many steps at once: ``{name: (steps, unix times, values)}``; ``clock`` is
        ``(step, time.monotonic())`` of each step's end, for the hang detector."""
        self._buffer.add_columns(columns, clock)
        self._hurry(self._urgency.columns_are_urgent(columns))

    def rows_due(self, series: Mapping[str, Iterable[float]]) -> bool:
        """Whether rows read but not yet recorded (their head's ``{name: values}``) should
        become points at the sender's look under way: a frame leaves at it anyway (before the
        sender starts: yes), or they hold a point that would be sent at once. They are judged,
        not kept (the gradient norms' history learns them when they are recorded)."""
        return self._sender is None or self._sender.due() or self._urgency.would_be_urgent(series)

    def _hurry(self, urgent: bool) -> None:
        """Send what is held at the sender's next look, not at its next send, if ``urgent``
        (before the sender starts, its first look sends whatever is held)."""
        if urgent and self._sender is not None:
            self._sender.hurry()

    def finish(
        self,
        reason: str = EndReason.COMPLETED,
        traceback_text: str | None = None,
        timeout: float = FLUSH_TIMEOUT,
    ) -> bool:
        """Send what is left and how the run ended; wait up to ``timeout`` s for the server.

        Returns whether the server acknowledged everything (False, doing nothing, in a child
        forked from the process that started the run). A second call waits, as the first did,
        for what the first sent. With ``timeout=0`` the end is queued and nothing waited for
        (the sender's own thread may call it so): the run stays among those the process's
        exit waits for, and its watchdog stays until the server has the end.

        When the server has not acknowledged everything in time, the rest is kept on disk in
        the run's spool for ``trainvitals sync`` or the next run started on the machine to
        deliver (:mod:`trainvitals.agent.sync`), and one warning says what, where, why and
        how to send it.

        Only the process that started the run ends it. A child forked from it (a data loader's
        worker) holds a copy of the run, but not its threads. Its exit, or a SIGTERM from
        ``Process.terminate()``, must not tell the watchdog that the run ended: the watchdog
        would then leave, and a later SIGKILL of the training process would go unreported.
        Nor should the child wait on a sender that is not running in it.
        """
        if not self.here:
            return False
        with self._lock:
            if self._sender is None:
                return True
            again, self._finished = self._finished, True
        if again:
            delivered = self._sender.wait(timeout, UNREACHABLE_FLUSH_TIMEOUT)
            if delivered or timeout > 0:
                self._release_watchdog()
            if not delivered and timeout > 0:
                self._keep_undelivered(timeout)
            return delivered
        if timeout > 0:
            exit_hooks.forget(self)
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler.sample_once()  # the last readings before the end
        delivered = self._sender.close(
            reason, time.time(), traceback_text or None, timeout, UNREACHABLE_FLUSH_TIMEOUT
        )
        if timeout > 0:
            self._release_watchdog()
        elif (watchdog := self._watchdog) is not None:  # it waits for the end's ack
            watchdog.release_faults()  # but a later crash is not this run's
        if not delivered and timeout > 0:
            self._keep_undelivered(timeout)
        return delivered

    def _keep_undelivered(self, waited: float) -> None:
        """The server did not acknowledge everything in time: keep the rest on disk and say
        plainly what, where, why, and how to send it (once)."""
        assert self._sender is not None
        if self._kept:
            return
        self._kept = True
        kept = self._sender.keep()
        if self._sender.wait(0):  # delivered after all, while keeping
            return
        error = self._sender.last_error
        why = f"the server at {self.config.server} " + (
            f"could not be reached ({error})" if error else f"did not answer within {waited:.0f} s"
        )
        if kept is None:
            where = "\n  They could not be written to disk either, and are lost."
        else:
            where = (
                f"\n  Spooled to {kept}: `trainvitals sync` sends them once the server is up "
                "(the next run started on this machine does it too), `trainvitals sync "
                "--server URL` to another address."
            )
            if not self._sender.handed_over:
                where += " This process also goes on sending them while it lives."
        log.warning(
            "trainvitals: run %r ended with %d frames not delivered (its points up to step %d "
            "and its end): %s.%s\n  $TRAINVITALS_SERVER (or server=) sets the address the "
            "agent sends to.",
            self.config.run_name,
            self._sender.unacknowledged,
            self.last_step,
            why,
            where,
        )

    def _release_watchdog(self) -> None:
        """The run told the server how it ended (or the process is exiting having tried):
        the watchdog can go. Once; from the finishing thread, or the sender's once the end
        of a finish that did not wait is acknowledged."""
        with self._lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.done()

    def on_tick(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on the sender thread before each send (to hand over what is held)."""
        self._tick_hooks.append(hook)

    def _tick(self) -> None:
        for hook in self._tick_hooks:
            try:
                hook()
            except Exception:
                log.exception("trainvitals: collecting steps failed")
        self._check_stall()

    def _check_stall(self) -> None:
        if self._finished:  # the sender may still be delivering, long after the last step
            return
        stalled = self._stall.check(time.monotonic())
        if stalled is not None and self._sender is not None:
            idle, threshold = stalled
            log.warning(
                "trainvitals: no training step for %.0f s (threshold %.1f s); "
                "reporting every thread's stack",
                idle,
                threshold,
            )
            self._sender.send_event(
                {
                    "type": STALL,
                    "time": time.time(),
                    "idle": idle,
                    "threshold": threshold,
                    "stacks": thread_stacks(),
                }
            )

    def report_autopsy(self, step: int, report: Mapping[str, Any]) -> None:
        """Send where the first NaN/Inf came from (see :mod:`trainvitals.agent.autopsy`)."""
        if self._sender is not None:
            frame = {"type": AUTOPSY, "time": time.time(), "step": step, "report": dict(report)}
            self._sender.send_event(_jsonable(frame))

    def _record_system(self, values: Mapping[str, float]) -> None:
        step, now = self._buffer.last_step, whole_micros(time.time())
        self._buffer.add(step, now, values)
        self._hurry(
            self._urgency.memory_is_urgent(values, now)
        )  # an OOM kill would take these with it
        if self._on_system is not None:
            try:
                self._on_system(step, now, values)
            except Exception as exc:  # a protective check must never end the sampler
                log.warning("trainvitals: memory watch stopped: %s: %s", type(exc).__name__, exc)
                self._on_system = None


def system_sources(gpu: Source | None = None) -> list[Source]:
    """The host, the GPUs (NVML unless ``gpu`` is given) and TensorFlow's GPU allocator."""
    sources: list[Source] = [HostSource()]
    gpu_source = gpu if gpu is not None else NvmlSource.create()
    if gpu_source is not None:
        sources.append(gpu_source)
    allocator = TfAllocatorSource.create()
    if allocator is not None and gpu is None:
        sources.append(allocator)
    return sources


def _jsonable(value: Any) -> Any:
    """Hyper-parameters as JSON: containers kept, anything else by its ``str``."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
