"""Prometheus metrics of one server process, for ``GET /metrics``.

Two kinds, in one exposition:

- what this process counts as it works: points and frames ingested, the writer's queue and
  transaction times, open agent and browser connections. With several replicas, sum them.
- what is read when Prometheus scrapes: runs by status, alerts firing, the notification
  backlog (from the database, so every replica reports the same numbers: take ``max``), and
  the latest system vitals of the running runs whose detector this process holds (each run
  is on one replica).

Each app has its own :class:`CollectorRegistry` (not ``prometheus_client``'s global one), so
several apps can live in one process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainvitals.protocol import RunStatus
from trainvitals.series import (
    GPU_MEM_TOTAL,
    GPU_MEM_USED,
    GPU_TEMP,
    HOST_LIMIT,
    HOST_RSS,
    HOST_WORKING_SET,
)

#: Seconds between two looks at how late the event loop runs.
LAG_INTERVAL = 0.25
#: Buckets of the pause histograms (seconds): a live push's budget is 0.25 s.
_PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

#: The labels of a run's vitals: few, and bounded by ``metrics_max_runs``.
RUN_LABELS = ("run_id", "run", "project")
#: GPUs per run whose readings are exported (``gpu0`` ... ``gpu15``).
MAX_GPUS = 16
_GPU_READING = re.compile(r"gpu(\d{1,2})/(\w+)")
_GPU_GAUGES = {
    GPU_TEMP: ("trainvitals_run_gpu_temperature_celsius", "GPU temperature (°C)"),
    GPU_MEM_USED: ("trainvitals_run_gpu_memory_used_bytes", "GPU memory in use (NVML)"),
    GPU_MEM_TOTAL: ("trainvitals_run_gpu_memory_total_bytes", "GPU memory in all (NVML)"),
}
_HOST_GAUGES = {
    HOST_RSS: ("trainvitals_run_host_memory_rss_bytes", "the training process's resident memory"),
    HOST_WORKING_SET: (
        "trainvitals_run_host_memory_working_set_bytes",
        "the memory cgroup's working set: what the kernel OOM-kills by",
    ),
    HOST_LIMIT: (
        "trainvitals_run_host_memory_limit_bytes",
        "the memory the process may use (its cgroup's limit, else the host's memory)",
    ),
}


@dataclass(frozen=True)
class RunVitals:
    """A running run's latest system readings, as its detector last saw them."""

    run_id: str
    project: str
    name: str
    readings: Mapping[str, float]
    step_time: float | None


@dataclass
class TeamCounts:
    """What the database says when Prometheus scrapes (read on a worker thread)."""

    runs: Mapping[str, int] = field(default_factory=dict)  # status -> runs
    firing: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (rule, severity)
    notices: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (channel, state)


class Metrics:
    """This process's counters and gauges, and the exposition of a scrape.

    Example:
        ```python
        metrics = Metrics()
        metrics.points.inc(512)
        text = metrics.exposition(TeamCounts(), vitals=[], omitted=0)
        ```
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.points = Counter(
            "trainvitals_points_ingested", "points stored from agents", registry=registry
        )
        self._frames = Counter(
            "trainvitals_frames_ingested",
            "agent frames received, by type (points, heartbeat, hello, end, ...)",
            ["type"],
            registry=registry,
        )
        self._frame_kinds: dict[str, Counter] = {}
        self.transaction_seconds = Histogram(
            "trainvitals_writer_commit_seconds",
            "seconds per writer transaction (its writes and the commit)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "trainvitals_writer_queue_depth", "writes waiting for the writer", registry=registry
        )
        self._storage_errors = Counter(
            "trainvitals_storage_errors",
            "errors of the database that stopped the writer from storing (connection lost, disk "
            "full, locked), by the driver's error class",
            ["error"],
            registry=registry,
        )
        self._storage_retries = Counter(
            "trainvitals_storage_retries",
            "tries of the database again after a storage error (transactions, or probes while "
            "writes are refused)",
            registry=registry,
        )
        self.writer_state = Gauge(
            "trainvitals_writer_state",
            "what the writer can do: 0 storing, 1 retrying a failed transaction, 2 refusing "
            "writes until the database answers (/healthz answers 503 for 1 and 2), 3 stopped",
            registry=registry,
        )
        self.agents = Gauge(
            "trainvitals_agent_connections", "open agent connections", registry=registry
        )
        self.watchdogs_waiting = Gauge(
            "trainvitals_watchdogs_waiting",
            "watchdogs' hellos waiting for their run's other connections here to close (a "
            "killed process's last frames still being read and stored)",
            registry=registry,
        )
        self.browsers = Gauge(
            "trainvitals_browser_connections", "open browser live connections", registry=registry
        )
        self.loop_lag = Histogram(
            "trainvitals_event_loop_lag_seconds",
            f"how late the event loop woke for a timer (one look every {LAG_INTERVAL} s): what"
            " every frame, acknowledgement and live push waited for then",
            buckets=_PAUSE_BUCKETS,
            registry=registry,
        )
        self.gc_pause = Histogram(
            "trainvitals_gc_pause_seconds",
            "Python's garbage collections, by generation: every thread of the process stops",
            ["generation"],
            buckets=_PAUSE_BUCKETS,
            registry=registry,
        )
        self._pauses: tuple[Callable[[str, dict[str, int]], None], asyncio.Task[None]] | None
        self._pauses = None

    def storage_error(self, error: BaseException, retried: bool) -> None:
        """The writer met ``error`` from the database; ``retried``: it tries again."""
        cause = getattr(error, "orig", None) or error
        self._storage_errors.labels(type(cause).__name__[:40]).inc()
        if retried:
            self._storage_retries.inc()

    def watch_pauses(self) -> None:
        """Measure the event loop's lateness and each garbage collection from now until
        :meth:`stop_watching`; call from the event loop."""
        began: list[float] = []
        #: Collections seen, (generation, seconds): a collection may start in any thread and
        #: at any allocation, so it only notes its pause here (no lock taken, nothing
        #: tracked allocated); the loop moves them into the histogram.
        collected: collections.deque[tuple[int, float]] = collections.deque(maxlen=10_000)

        def collecting(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                began[:] = [time.perf_counter()]
            elif began:
                collected.append((info["generation"], time.perf_counter() - began.pop()))

        gc.callbacks.append(collecting)
        task = asyncio.create_task(self._watch(collected), name="trainvitals-pauses")
        self._pauses = collecting, task

    async def stop_watching(self) -> None:
        if self._pauses is None:
            return
        collecting, task = self._pauses
        self._pauses = None
        gc.callbacks.remove(collecting)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _watch(self, collected: collections.deque[tuple[int, float]]) -> None:
        generations = [self.gc_pause.labels(str(generation)) for generation in range(3)]
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            self.loop_lag.observe(max(0.0, loop.time() - due))
            while collected:
                generation, seconds = collected.popleft()
                generations[generation].observe(seconds)

    def frame(self, kind: str) -> None:
        """One agent frame of ``kind`` arrived (a valid one: the type is from the protocol)."""
        child = self._frame_kinds.get(kind)
        if child is None:
            child = self._frame_kinds[kind] = self._frames.labels(kind)
        child.inc()

    def exposition(self, team: TeamCounts, vitals: Iterable[RunVitals], omitted: int) -> bytes:
        """The text format of this process's metrics and of a scrape's readings."""
        scrape = CollectorRegistry()
        scrape.register(_Families(_team_families(team, vitals, omitted)))
        return generate_latest(self.registry) + generate_latest(scrape)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _team_families(team: TeamCounts, vitals: Iterable[RunVitals], omitted: int) -> list[Metric]:
    runs = GaugeMetricFamily("trainvitals_runs", "runs by status", labels=["status"])
    for status in RunStatus:
        runs.add_metric([status.value], team.runs.get(status.value, 0))
    firing = GaugeMetricFamily(
        "trainvitals_alerts_firing",
        "alerts firing, by rule and severity",
        labels=["rule", "severity"],
    )
    for (rule, severity), count in sorted(team.firing.items()):
        firing.add_metric([rule, severity], count)
    pending = GaugeMetricFamily(
        "trainvitals_notifications_pending",
        "notifications waiting for delivery, by channel",
        labels=["channel"],
    )
    failed = GaugeMetricFamily(
        "trainvitals_notifications_failed",
        "notifications given up after their retries, by channel",
        labels=["channel"],
    )
    for (channel, state), count in sorted(team.notices.items()):
        (failed if state == "failed" else pending).add_metric([channel], count)
    left_out = GaugeMetricFamily(
        "trainvitals_run_vitals_omitted",
        "running runs of this process whose vitals are not exported (beyond metrics_max_runs)",
        value=omitted,
    )
    return [runs, firing, pending, failed, left_out, *_vitals_families(vitals)]


def _vitals_families(vitals: Iterable[RunVitals]) -> list[Metric]:
    gpu = {
        field: GaugeMetricFamily(name, doc, labels=[*RUN_LABELS, "gpu"])
        for field, (name, doc) in _GPU_GAUGES.items()
    }
    host = {
        series: GaugeMetricFamily(name, doc, labels=list(RUN_LABELS))
        for series, (name, doc) in _HOST_GAUGES.items()
    }
    step = GaugeMetricFamily(
        "trainvitals_run_step_seconds", "the last step's time (seconds)", labels=list(RUN_LABELS)
    )
    for run in vitals:
        labels = [run.run_id, run.name, run.project]
        for name, value in run.readings.items():
            if name in host:
                host[name].add_metric(labels, value)
                continue
            match = _GPU_READING.fullmatch(name)
            if match and match[2] in gpu and int(match[1]) < MAX_GPUS:
                gpu[match[2]].add_metric([*labels, match[1]], value)
        if run.step_time is not None:
            step.add_metric(labels, run.step_time)
    return [*gpu.values(), *host.values(), step]
