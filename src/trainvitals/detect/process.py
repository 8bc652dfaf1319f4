"""Rules on the training process: hangs, slow steps, and how it ended."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping

import numpy as np

from trainvitals.detect import settings as s
from trainvitals.detect.base import Context, Rule, finite
from trainvitals.detect.evidence import CrashEvidence, SlowdownEvidence
from trainvitals.detect.stats import RollingWindow, trimmed_mean
from trainvitals.detect.text import duration, number, ratio, size
from trainvitals.detect.types import Finding, Record, Severity
from trainvitals.protocol import ArrayColumns, EndReason
from trainvitals.series import (
    HOST_CPU_PERCENT,
    HOST_LIMIT,
    HOST_RSS,
    HOST_SWAP_USED,
    HOST_WORKING_SET,
    STEP_TIME,
    is_system,
)

# What a hung stack usually shows, and what to do about it (first match wins).
_STALL_CAUSES = (
    (
        ("py_dataset", "data_adapter", "generator", "__next__", "__getitem__", "queue.py"),
        "The input pipeline is blocked: the stacks show training waiting for the next batch "
        "from Python code. Check the generator or loader for a deadlock, a dead worker or a "
        "remote read that never returns; feeding data through tf.data (with `prefetch` and "
        "`num_parallel_calls=tf.data.AUTOTUNE`) keeps Python off the step path.",
    ),
    (
        ("collective", "nccl", "all_reduce", "allreduce", "barrier", "multi_worker"),
        "A collective is waiting for a peer: check that every worker is alive and reached "
        "the same step (NCCL_DEBUG=INFO shows who waits for whom), and the network between "
        "them.",
    ),
    (
        ("acquire", "lock", "wait(", "join("),
        "A thread waits on a lock or another thread: the stacks show which; look for the "
        "thread that holds it.",
    ),
)
STALL_HINT = (
    "Look at the main thread's stack: it shows where training waits. A swap storm or a "
    "stuck filesystem also stalls steps; check host memory and I/O."
)


def stall_hint(stacks: str) -> str:
    lowered = stacks.lower()
    for needles, hint in _STALL_CAUSES:
        if any(needle in lowered for needle in needles):
            return hint
    return STALL_HINT


class StallRule(Rule):
    """No step for far longer than usual while the process lives (the agent's report)."""

    id = "stall"

    @classmethod
    def reads(cls, name: str) -> bool:
        return not is_system(name)  # any step resolves a stall

    def __init__(self, context: Context, settings: s.Stall) -> None:
        super().__init__(context)
        self._step: int | None = None

    def stalled(
        self, step: int, time: float, idle: float, threshold: float, stacks: str
    ) -> Finding:
        self._step = step
        record = Record(step, time, {})
        message = (
            f"No training step for {duration(idle)} (alarm at {duration(threshold)}); the "
            f"process is alive, last step {step}"
        )
        evidence = {"idle_s": idle, "threshold_s": threshold, "stacks": stacks}
        return self.fire("", record, "critical", message, stall_hint(stacks), evidence)

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        if not self.firing or self._step is None:
            return []
        resumed = [
            (int(steps[i]), float(times[i]))
            for steps, times, _ in dense.values()
            for i in np.flatnonzero(steps > self._step)[:1]
        ]
        if not resumed:
            return []
        step, time = min(resumed)
        return [self.resolve("", Record(step, time, {}))]

    def observe(self, record: Record) -> list[Finding]:
        if (
            self.firing
            and self._step is not None
            and record.step > self._step
            and any(not is_system(n) for n in record.values)
        ):
            return [self.resolve("", record)]
        return []


class SlowdownRule(Rule):
    """The recent step time far above its baseline, each a mean without the longest steps.

    A process that shares its CPU runs a few short steps in each of its turns and waits out
    the others' turns in one of them: its median step keeps its speed while its steps per
    second fall N+1 times. A mean shows that; leaving out the longest ``trim`` share of the
    steps keeps a rare long one (an epoch's end, a collection) from moving it.

    Variables that join the training mid-run (a backbone unfrozen) make every step do more
    work: the baseline starts again from there, warm-up included."""

    id = "slowdown"
    watches = (STEP_TIME,)
    _EVERY = 10

    def __init__(self, context: Context, settings: s.Slowdown) -> None:
        super().__init__(context)
        self.settings = settings
        self._baseline = RollingWindow(settings.baseline_window, trim=settings.trim)
        self._recent: deque[float] = deque(maxlen=settings.recent)
        self._seen = 0
        self._since = 0
        self._above = 0
        self._above_seconds = 0.0
        self._paused = 0  # steps back at the pace since the last slow judgement
        #: Step times that left the recent window while a slowdown was being judged.
        self._suspect: list[float] = []
        self._calm = 0

    def observe(self, record: Record) -> list[Finding]:
        value = record.values.get(STEP_TIME)
        if value is None or not finite(value) or value <= 0:
            return []
        cfg = self.settings
        if self.new_regime(record.step):
            self._baseline = RollingWindow(cfg.baseline_window, trim=cfg.trim)
            self._recent.clear()
            self._seen = self._since = self._above = self._paused = 0
            self._above_seconds = 0.0
            self._suspect = []
        self._seen += 1
        if self._seen <= cfg.warmup_steps:
            return []
        if len(self._recent) == self._recent.maxlen:
            self._to_baseline([self._recent[0]])
        self._recent.append(value)
        self._since += 1
        if self._since < self._EVERY or len(self._baseline) < cfg.recent:
            return []
        advanced, self._since = self._since, 0
        return self._judge(record, advanced)

    def skim(self, dense: Mapping[str, ArrayColumns]) -> list[Finding] | None:
        column = dense.get(STEP_TIME)
        if column is None:
            return []
        cfg = self.settings
        if self._seen < cfg.warmup_steps or self.regime_pending:
            return None
        steps, times, values = column
        keep = np.isfinite(values) & (values > 0)
        steps, times, fresh = steps[keep], times[keep], values[keep].tolist()
        # Judged at the very steps observe() judges (every _EVERY, each on the step times up
        # to it), so that what fires and when does not depend on where the frames end.
        out: list[Finding] = []
        done = 0
        while done < len(fresh):
            take = fresh[done : done + max(1, self._EVERY - self._since)]
            done += len(take)
            self._seen += len(take)
            pushed_out = len(self._recent) + len(take) - cfg.recent
            if pushed_out > 0:  # what leaves the recent window joins the baseline
                self._to_baseline((list(self._recent) + take)[:pushed_out])
            self._recent.extend(take)
            self._since += len(take)
            if self._since >= self._EVERY and len(self._baseline) >= cfg.recent:
                advanced, self._since = self._since, 0
                out += self._judge(
                    Record(int(steps[done - 1]), float(times[done - 1]), {}), advanced
                )
        return out

    def _to_baseline(self, values: list[float]) -> None:
        """Step times leaving the recent window join the baseline, except while a slowdown is
        being judged: the baseline would absorb the very steps it is judged against (a
        slowdown early in a run, on a short baseline, would then never last long enough)."""
        if self._above and "" not in self.firing:
            self._suspect += values
        else:
            self._baseline.extend(values)

    def _judge(self, record: Record, advanced: int) -> list[Finding]:
        cfg = self.settings
        base, now = self._baseline.trimmed, trimmed_mean(self._recent, cfg.trim)
        half = (1 + (cfg.factor - 1) / 2) * base  # where a slowdown resolves
        slow = now >= cfg.factor * base and now - base >= cfg.min_increase
        # Once counting, a window that dips under the factor but stays above the level a
        # slowdown resolves at goes on counting: contention's turns come in bursts.
        holding = bool(self._above) and now >= half and now - base >= cfg.min_increase
        if slow or holding:
            self._above += advanced
            self._paused = 0
            # The slow steps' own time, summed from the stream: a burst of contention that
            # is over in a blink is no slowdown, however many fast steps it spans.
            self._above_seconds += sum(itertools.islice(reversed(self._recent), advanced))
            self._calm = 0
        else:
            # Contention comes in bursts: up to `grace` steps back at the pace pause the
            # count, more end it.
            self._paused += advanced if self._above else 0
            if self._paused > cfg.grace or not self._above:
                if self._suspect:
                    # Slow for less than `sustain` steps: a false start, the pace after all.
                    # Slow for longer, they were a slowdown not yet 2 s long: they must not
                    # become the baseline that the rest of it is judged against.
                    if self._above < cfg.sustain:
                        self._baseline.extend(self._suspect)
                    self._suspect = []
                self._above, self._above_seconds, self._paused = 0, 0.0, 0
            recovered = now < half
            self._calm = self._calm + advanced if recovered else 0
        lasted = self._above >= cfg.sustain and self._above_seconds >= cfg.sustain_seconds
        if slow and lasted and "" not in self.firing:
            finding = self._fire(record, base, now)
            self._baseline.extend(self._suspect)  # fired: a lasting slowdown is the new normal
            self._suspect = []
            return [finding]
        if "" in self.firing and self._calm >= cfg.sustain:
            return [self.resolve("", record)]
        return []

    def _fire(self, record: Record, base: float, now: float) -> Finding:
        latest = self.context.latest
        evidence: SlowdownEvidence = {"step_time": now, "baseline": base, "ratio": now / base}
        causes = []
        swap = latest.get(HOST_SWAP_USED)
        if swap:
            evidence["swap_used"] = swap
            causes.append(f"the host swaps ({size(swap)} in swap)")
        throttled = [k for k, v in latest.items() if k.endswith("/throttle") and v]
        if throttled:
            evidence["throttle"] = {k: latest[k] for k in throttled}
            causes.append("the GPU is throttled")
        cpu = latest.get(HOST_CPU_PERCENT)
        if cpu is not None:
            evidence["cpu_percent"] = cpu
        message = (
            f"Steps take {ratio(now / base)} as long as before: {number(now)} s against "
            f"{number(base)} s"
        )
        if causes:
            message += "; " + " and ".join(causes)
            hint = (
                "Relieve the resource named: free host memory so it stops swapping, cool or "
                "unthrottle the GPU (see the thermal alert)."
            )
        else:
            hint = (
                "Steps wait on something else: an input pipeline that can't keep up (use "
                "tf.data with `prefetch` and `num_parallel_calls`, `cache` decoded data), "
                "another process on the same CPU or GPU, a slow filesystem, or a callback "
                "doing heavy work each step."
            )
        return self.fire("", record, "warning", message, hint, evidence)


_END_HINTS: dict[str, str] = {
    EndReason.OOM_KILLED: (
        "The kernel's OOM killer ended the run at its memory limit: find what grows (see the "
        "memory chart), lower the batch size or tf.data buffers, or raise the limit."
    ),
    EndReason.SIGKILL: (
        "Killed from outside with SIGKILL: a scheduler (preemption, time limit), an OOM "
        "killer outside this cgroup, or a person. Check the scheduler's log and `dmesg`; "
        "checkpoint often (`keras.callbacks.BackupAndRestore`) so a rerun resumes."
    ),
    EndReason.SIGTERM: (
        "Asked to stop with SIGTERM: usually preemption or a time limit. Save a checkpoint "
        "on SIGTERM (`keras.callbacks.BackupAndRestore`) to resume."
    ),
    EndReason.SIGINT: "Interrupted (Ctrl-C).",
    EndReason.SIGSEGV: (
        "A segmentation fault in native code: usually mismatched CUDA/cuDNN/driver versions "
        "or a library bug. The faulthandler dump shows the Python frames; check the "
        "versions in the environment panel."
    ),
    EndReason.HEARTBEAT_LOST: (
        "Nothing heard from the run, not even a heartbeat: the host died, rebooted or lost "
        "its network, or the process froze entirely (swap storm). Check the host."
    ),
}
_EXCEPTION_HINTS = (
    (
        "ResourceExhausted",
        "Out of GPU memory: a smaller batch or gradient accumulation, mixed precision, and "
        "`set_memory_growth` if other processes share the card.",
    ),
    ("MemoryError", "Out of host memory: a smaller batch or smaller tf.data buffers."),
    (
        "InvalidArgumentError",
        "A tensor check failed (often `check_numerics` on NaN, or a shape/label out of "
        "range): the traceback names the op.",
    ),
)


class CrashRule(Rule):
    """The process ended other than by completing."""

    id = "crash"

    def __init__(self, context: Context, settings: s.Crash) -> None:
        super().__init__(context)

    def ended(self, reason: str, time: float, traceback: str | None) -> Finding:
        record = Record(self.context.step, time, {})
        readings = self.context.memory_readings()
        evidence: CrashEvidence = {"end_reason": reason, "last_step": self.context.step}
        if readings:
            evidence["last_readings"] = readings
        severity: Severity = "critical"
        if reason == EndReason.EXCEPTION:
            last_line = (traceback or "").strip().splitlines()[-1:] or [""]
            evidence["exception"] = last_line[0]
            # An exception with no message prints its class alone; with no traceback at all,
            # say so rather than end the sentence on nothing.
            said = last_line[0] or "an exception left it, and its traceback was not seen"
            message = f"The run crashed at step {self.context.step}: {said}"
            hint = next(
                (h for key, h in _EXCEPTION_HINTS if key in (traceback or "")),
                "The traceback shows where it failed.",
            )
        else:
            what: str = {
                EndReason.OOM_KILLED.value: "was killed by the kernel's OOM killer",
                EndReason.HEARTBEAT_LOST.value: "went silent (heartbeats stopped)",
            }.get(reason, f"ended by {reason.removeprefix('signal:')}")
            message = f"The run {what} at step {self.context.step}"
            working_set, limit = readings.get(HOST_WORKING_SET), readings.get(HOST_LIMIT)
            if working_set is not None and limit:
                message += f"; last working set {size(working_set)} of {size(limit)}"
            elif readings.get(HOST_RSS) is not None and limit:
                message += f"; last RSS {size(readings[HOST_RSS])} of {size(limit)}"
            hint = _END_HINTS.get(reason, "Check the process's logs and the host.")
            if reason == EndReason.SIGINT:
                severity = "info"
        return self.fire("", record, severity, message, hint, evidence)
