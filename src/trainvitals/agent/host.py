"""Host vitals: memory as the kernel counts it, the effective limit, swap, CPU, disk.

Under a memory cgroup the kernel charges, reclaims and OOM-kills by the cgroup's own count,
not by the process's resident set: ``host/working_set`` is that count as kubelet and cAdvisor
read it (v2 ``memory.current``, v1 ``memory.usage_in_bytes``, less the inactive file cache the
kernel drops before it kills anyone), and ``host/limit`` is the tightest limit enforced on it
along the cgroup's ancestors (v2 ``memory.max`` and ``memory.high``, v1
``memory.limit_in_bytes``), else physical memory. The process's resident set stays a series
of its own, anonymous and file-backed apart: TensorFlow maps about a gigabyte of shared
libraries that the RSS counts and the cgroup does not charge again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import psutil

from trainvitals.series import (
    HOST_AVAILABLE,
    HOST_CPU_PERCENT,
    HOST_CPU_TEMP,
    HOST_DISK_FREE,
    HOST_LIMIT,
    HOST_RSS,
    HOST_RSS_ANON,
    HOST_RSS_FILE,
    HOST_SWAP_USED,
    HOST_WORKING_SET,
)

#: cgroup v1 writes "no limit" as a huge page-aligned number.
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup this process is charged to (v1 or v2), read through its files.

    Args:
        path: its directory under the cgroup mount.
        version: 1 or 2.
        limit: the tightest limit enforced along it and its ancestors (bytes), or None.
    """

    path: Path
    version: int
    limit: int | None

    def working_set(self) -> int | None:
        """Bytes charged less the inactive file cache (kubelet's working set), or None where
        the files cannot be read."""
        usage_file, inactive = (
            ("memory.current", ("inactive_file",))
            if self.version == 2
            else ("memory.usage_in_bytes", ("total_inactive_file", "inactive_file"))
        )
        try:
            usage = int((self.path / usage_file).read_text())
            stat = _flat_keyed(self.path / "memory.stat")
        except (OSError, ValueError):
            return None
        cache = next((stat[key] for key in inactive if key in stat), 0)
        return max(usage - cache, 0)

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer has killed in this cgroup (v2
        ``memory.events``, v1 ``memory.oom_control``), or None where no counter is readable."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            return _flat_keyed(self.path / name).get("oom_kill")
        except (OSError, ValueError):
            return None


def read_memory_cgroup(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> MemoryCgroup | None:
    """This process's memory cgroup, or None where it has none. A v1 memory hierarchy wins
    over the unified one (hybrid hosts mount both; only one holds the memory controller)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        try:
            _, controllers, path = line.split(":", 2)
        except ValueError:
            continue
        if "memory" in controllers.split(","):
            base = Path(root) / "memory"
            limits = _limits_up(base, path, ("memory.limit_in_bytes",))
            return MemoryCgroup(base / path.lstrip("/"), 1, _tightest(limits))
        if controllers == "":
            unified = path
    if unified is None:
        return None
    base = Path(root)
    limits = _limits_up(base, unified, ("memory.max", "memory.high"))
    return MemoryCgroup(base / unified.lstrip("/"), 2, _tightest(limits))


def cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The tightest memory-cgroup limit in bytes of this process, or None when unlimited."""
    group = read_memory_cgroup(proc_cgroup, root)
    return None if group is None else group.limit


def cgroup_oom_kills(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup,
    or None where no counter is readable."""
    group = read_memory_cgroup(proc_cgroup, root)
    return None if group is None else group.oom_kills()


def _tightest(limits: list[int]) -> int | None:
    real = [limit for limit in limits if 0 < limit < _V1_UNLIMITED]
    return min(real) if real else None


def _flat_keyed(path: Path) -> dict[str, int]:
    """A cgroup "flat keyed" file (``memory.stat``, ``memory.events``): key value per line."""
    found = {}
    for row in path.read_text().splitlines():
        key, _, value = row.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


def _limits_up(base: Path, path: str, filenames: tuple[str, ...]) -> list[int]:
    """The limit files' values from the process's cgroup up to the mount's root."""
    found = []
    current = base / path.lstrip("/")
    while True:
        for filename in filenames:
            try:
                text = (current / filename).read_text().strip()
            except OSError:
                text = ""
            if text.isdigit():  # "max" (v2) is no limit
                found.append(int(text))
        if current == base or base not in current.parents:
            return found
        current = current.parent


def process_memory(status: str = "/proc/self/status") -> dict[str, int] | None:
    """This process's resident set, anonymous and file-backed apart (bytes), from the
    kernel's own per-process counters: ``{"rss", "anon", "file"}``, or None where
    ``/proc`` has none (not Linux). Shared memory (``RssShmem``) is in ``rss`` only."""
    fields = {}
    try:
        for row in Path(status).read_text().splitlines():
            key, _, value = row.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 3:
        return None
    return {"rss": fields["VmRSS"], "anon": fields["RssAnon"], "file": fields["RssFile"]}


def effective_memory_limit() -> int:
    physical = int(psutil.virtual_memory().total)
    cgroup = cgroup_memory_limit()
    return min(physical, cgroup) if cgroup else physical


class HostDescription(TypedDict):
    """What :class:`HostSource` tells of the machine, under ``host`` in the run's environment."""

    memory_limit: int  # bytes: the effective limit, the cgroup's or the physical memory
    cgroup_memory_limit: int | None
    cgroup: str | None  # "v1", "v2", or None outside a memory cgroup
    physical_memory: int
    cpu_count: int | None
    disk_path: str


class HostSource:
    """Samples ``host/*`` series for this process.

    Args:
        disk_path: the directory whose free space is reported (the working or checkpoint dir).
        cgroup: the memory cgroup to read (default: this process's); tests pass a fake tree.
    """

    name = "host"

    def __init__(self, disk_path: str | None = None, cgroup: MemoryCgroup | None = None) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first reading only starts the measurement
        self._disk_path = disk_path or os.getcwd()
        self._cgroup = cgroup or read_memory_cgroup()
        physical = self._physical = int(psutil.virtual_memory().total)
        cgroup_limit = None if self._cgroup is None else self._cgroup.limit
        self._limit = min(physical, cgroup_limit) if cgroup_limit else physical
        self._sensors = hasattr(psutil, "sensors_temperatures")

    def describe(self) -> HostDescription:
        return {
            "memory_limit": self._limit,
            "cgroup_memory_limit": None if self._cgroup is None else self._cgroup.limit,
            "cgroup": None if self._cgroup is None else f"v{self._cgroup.version}",
            "physical_memory": int(psutil.virtual_memory().total),
            "cpu_count": psutil.cpu_count(),
            "disk_path": self._disk_path,
        }

    def sample(self) -> dict[str, float]:
        values = {
            HOST_AVAILABLE: float(psutil.virtual_memory().available),
            HOST_LIMIT: float(self._limit),
            HOST_SWAP_USED: float(psutil.swap_memory().used),
            HOST_CPU_PERCENT: float(self._process.cpu_percent(None)),
            HOST_DISK_FREE: float(psutil.disk_usage(self._disk_path).free),
        }
        resident = process_memory()
        if resident is None:
            values[HOST_RSS] = float(self._process.memory_info().rss)
        else:
            values[HOST_RSS] = float(resident["rss"])
            values[HOST_RSS_ANON] = float(resident["anon"])
            values[HOST_RSS_FILE] = float(resident["file"])
        # Only under a limit the cgroup enforces: without one, its count is that of every
        # process in it (a session, a CI job), of which the kernel judges each by its own
        # size when the machine runs out, and the process's resident set is the figure.
        enforced = self._cgroup is not None and self._limit < self._physical
        working_set = self._cgroup.working_set() if enforced and self._cgroup else None
        if working_set is not None:
            # The kernel reclaims, throttles or kills before the charge passes the limit; what
            # shows above it is a page batch in flight, never memory the process holds.
            values[HOST_WORKING_SET] = float(min(working_set, self._limit))
        if self._sensors:
            temperatures = [
                entry.current
                for entries in psutil.sensors_temperatures().values()
                for entry in entries
                if entry.current
            ]
            if temperatures:
                values[HOST_CPU_TEMP] = float(max(temperatures))
            else:
                self._sensors = False  # no sensors here; don't look every second
        return values
