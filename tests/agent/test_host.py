"""Host readings: this process and the effective memory limit from cgroups v1 and v2."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from harness.processes import ServerProcess, memory_cgroup, run_in_cgroup, run_series, wait_for
from trainvitals.agent.host import HostSource, cgroup_memory_limit


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
