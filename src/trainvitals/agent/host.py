"""Host vitals: process memory, the effective memory limit, swap, CPU, disk.

The effective limit is what the OOM killer enforces: the memory cgroup's limit (v2
``memory.max``, v1 ``memory.limit_in_bytes``, the tightest along the cgroup's ancestors) when
there is one, else physical memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

from trainvitals.series import (
    HOST_AVAILABLE,
    HOST_CPU_PERCENT,
    HOST_CPU_TEMP,
    HOST_DISK_FREE,
    HOST_LIMIT,
    HOST_RSS,
    HOST_SWAP_USED,
)

#: cgroup v1 writes "no limit" as a huge page-aligned number.
_V1_UNLIMITED = 1 << 60


def cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The tightest memory-cgroup limit in bytes of this process, or None when unlimited."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2, unified hierarchy
            limits += _limits_up(Path(root), path, "memory.max")
        elif "memory" in controllers.split(","):
            limits += _limits_up(Path(root) / "memory", path, "memory.limit_in_bytes")
    real = [limit for limit in limits if limit < _V1_UNLIMITED]
    return min(real) if real else None


def cgroup_oom_kills(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup
    (v2 ``memory.events``, v1 ``memory.oom_control``), or None where no counter is readable."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            counter = Path(root) / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            counter = Path(root) / "memory" / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            fields = dict(row.split() for row in counter.read_text().splitlines() if row.strip())
        except (OSError, ValueError):
            continue
        if "oom_kill" in fields:
            return int(fields["oom_kill"])
    return None


def _limits_up(base: Path, path: str, filename: str) -> list[int]:
    """The limit file's values from the process's cgroup up to the mount's root."""
    found = []
    current = base / path.lstrip("/")
    while True:
        try:
            text = (current / filename).read_text().strip()
        except OSError:
            text = ""
        if text and text != "max":
            found.append(int(text))
        if current == base or base not in current.parents:
            return found
        current = current.parent


def effective_memory_limit() -> int:
    physical = int(psutil.virtual_memory().total)
    cgroup = cgroup_memory_limit()
    return min(physical, cgroup) if cgroup else physical


class HostSource:
    """Samples ``host/*`` series for this process.

    Args:
        disk_path: the directory whose free space is reported (the working or checkpoint dir).
    """

    name = "host"

    def __init__(self, disk_path: str | None = None) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first reading only starts the measurement
        self._disk_path = disk_path or os.getcwd()
        self._limit = effective_memory_limit()
        self._sensors = hasattr(psutil, "sensors_temperatures")

    def describe(self) -> dict[str, Any]:
        return {
            "memory_limit": self._limit,
            "cgroup_memory_limit": cgroup_memory_limit(),
            "physical_memory": int(psutil.virtual_memory().total),
            "cpu_count": psutil.cpu_count(),
            "disk_path": self._disk_path,
        }

    def sample(self) -> dict[str, float]:
        values = {
            HOST_RSS: float(self._process.memory_info().rss),
            HOST_AVAILABLE: float(psutil.virtual_memory().available),
            HOST_LIMIT: float(self._limit),
            HOST_SWAP_USED: float(psutil.swap_memory().used),
            HOST_CPU_PERCENT: float(self._process.cpu_percent(None)),
            HOST_DISK_FREE: float(psutil.disk_usage(self._disk_path).free),
        }
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
