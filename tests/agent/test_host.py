"""Host readings: the effective memory limit from cgroups v1 and v2, and the sampler."""

from __future__ import annotations

import logging
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import ServerProcess, memory_cgroup, run_in_cgroup, run_series, wait_for
from trainvitals.agent.host import HostSource, cgroup_memory_limit
from trainvitals.agent.sampler import Sampler


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_takes_the_tightest_limit_up_the_tree(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/jobs/train\n")
    write(tmp_path / "fs/memory.max", "max\n")
    write(tmp_path / "fs/jobs/memory.max", "8589934592\n")
    write(tmp_path / "fs/jobs/train/memory.max", "max\n")
    assert cgroup_memory_limit(str(tmp_path / "proc"), str(tmp_path / "fs")) == 8 * 2**30


def test_cgroup_v1_memory_controller(tmp_path: Path) -> None:
    write(tmp_path / "proc", "9:pids:/\n4:memory:/slurm/job1\n0::/\n")
    write(tmp_path / "fs/memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path / "fs/memory/slurm/job1/memory.limit_in_bytes", "2147483648\n")
    assert cgroup_memory_limit(str(tmp_path / "proc"), str(tmp_path / "fs")) == 2 * 2**30


def test_no_cgroup_limit(tmp_path: Path) -> None:
    write(tmp_path / "proc", "4:memory:/\n")
    write(tmp_path / "fs/memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_memory_limit(str(tmp_path / "proc"), str(tmp_path / "fs")) is None
    assert cgroup_memory_limit(str(tmp_path / "missing"), str(tmp_path / "fs")) is None


def test_host_source_reads_this_process() -> None:
    values = HostSource().sample()
    assert 0 < values["host/rss"] < values["host/limit"]
    assert values["host/available"] > 0 and values["host/disk_free"] > 0
    assert values["host/swap_used"] >= 0 and values["host/cpu_percent"] >= 0


class Broken:
    name = "broken"

    def describe(self) -> dict[str, str]:
        return {}

    def sample(self) -> dict[str, float]:
        raise OSError("sensor gone")


class Counting:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def describe(self) -> dict[str, str]:
        return {}

    def sample(self) -> dict[str, float]:
        self.calls += 1
        return {"x": float(self.calls)}


def test_a_failing_source_is_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    recorded: list[dict[str, float]] = []
    counting = Counting()
    sampler = Sampler([Broken(), counting], lambda v: recorded.append(dict(v)))
    with caplog.at_level(logging.WARNING, logger="trainvitals"):
        sampler.sample_once()
        sampler.sample_once()
    assert recorded == [{"x": 1.0}, {"x": 2.0}]
    assert [r.getMessage() for r in caplog.records] == [
        "trainvitals: broken readings stopped: OSError: sensor gone"
    ]


def test_schedule_follows_the_clock_without_drift_and_stops_at_once() -> None:
    now = [100.0]
    samples: list[float] = []
    sampled = threading.Event()

    class Slow(Counting):
        def sample(self) -> dict[str, float]:
            samples.append(now[0])
            now[0] += 0.3  # each sample takes 0.3 s of the injected clock
            sampled.set()
            return {"x": 1.0}

    def advance(timeout: float) -> bool:  # waiting, on fake time
        now[0] += timeout
        return len(samples) >= 4

    sampler = Sampler([Slow()], lambda v: None, interval=1.0, clock=lambda: now[0], wait=advance)
    sampler.start()
    wait_for(lambda: len(samples) >= 4, timeout=5, what="four samples")
    sampler.stop(timeout=5)
    assert samples == [100.0, 101.0, 102.0, 103.0]  # every second on the dot, not every 1.3 s

    real = Sampler([Counting()], lambda v: None, interval=3600)
    real.start()
    started = time.monotonic()
    real.stop(timeout=5)
    # An hour's wait is cut short: stop() returns before its 5 s join would give up.
    assert time.monotonic() - started < 4


CGROUP_SCRIPT = textwrap.dedent(
    """
    import sys, trainvitals
    with trainvitals.Monitor(server=sys.argv[1], run_name="cgroup", system_metrics=0.05) as mon:
        mon.log(1, metrics={"loss": 1.0})
    """
)


def test_host_limit_is_the_memory_cgroups_limit(server: ServerProcess, tmp_path: Path) -> None:
    limit = 3 * 2**30
    script = tmp_path / "in_cgroup.py"
    script.write_text(CGROUP_SCRIPT)
    with memory_cgroup(limit) as group:
        result = run_in_cgroup(group, sys.executable, str(script), server.url)
        assert result.returncode == 0, result.stderr
    runs = wait_for(lambda: server.get("/api/v1/runs")["runs"], what="the run")
    series = run_series(server, runs[0]["id"], "host/limit", "host/rss")
    assert series["host/limit"]["value"] and set(series["host/limit"]["value"]) == {limit}
    assert all(0 < rss < limit for rss in series["host/rss"]["value"])
    env = server.get(f"/api/v1/runs/{runs[0]['id']}")["env"]
    assert env["host"]["memory_limit"] == limit
