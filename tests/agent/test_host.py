"""Host readings: this process and the effective memory limit from cgroups v1 and v2."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from harness.polling import wait_for
from harness.processes import ServerProcess, memory_cgroup, run_in_cgroup, run_series
from trainvitals.agent.host import (
    HostSource,
    cgroup_memory_limit,
    cgroup_oom_kills,
    process_memory,
    read_memory_cgroup,
)


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


def test_cgroup_v2_working_set_against_the_tightest_of_max_and_high(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/jobs/train\n")
    write(tmp_path / "fs/jobs/memory.max", "8589934592\n")
    write(tmp_path / "fs/jobs/train/memory.max", "max\n")
    write(tmp_path / "fs/jobs/train/memory.high", "6442450944\n")
    write(tmp_path / "fs/jobs/train/memory.current", "3221225472\n")
    write(tmp_path / "fs/jobs/train/memory.stat", "anon 1\ninactive_file 1073741824\nfile 9\n")
    write(tmp_path / "fs/jobs/train/memory.events", "low 0\nhigh 4\nmax 9\noom 2\noom_kill 2\n")
    group = read_memory_cgroup(str(tmp_path / "proc"), str(tmp_path / "fs"))
    assert group is not None and group.version == 2 and group.limit == 6 * 2**30
    assert group.working_set() == 2 * 2**30  # charged less the inactive file cache
    assert group.oom_kills() == 2
    assert cgroup_oom_kills(str(tmp_path / "proc"), str(tmp_path / "fs")) == 2


def test_cgroup_v1_working_set_and_oom_kills_on_a_hybrid_host(tmp_path: Path) -> None:
    write(tmp_path / "proc", "4:memory:/slurm/job1\n0::/\n")  # v1 memory beside unified
    write(tmp_path / "fs/memory/slurm/memory.limit_in_bytes", "2147483648\n")
    job = tmp_path / "fs/memory/slurm/job1"
    write(job / "memory.limit_in_bytes", "9223372036854771712\n")
    write(job / "memory.usage_in_bytes", "1610612736\n")
    write(job / "memory.stat", "inactive_file 5\ntotal_inactive_file 536870912\n")
    write(job / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    group = read_memory_cgroup(str(tmp_path / "proc"), str(tmp_path / "fs"))
    assert group is not None and group.version == 1 and group.limit == 2 * 2**30
    assert group.working_set() == 2**30  # the hierarchy's inactive file, not the cgroup's own
    assert group.oom_kills() == 1


def test_a_cgroup_whose_files_cannot_be_read_gives_no_working_set(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/job\n")
    write(tmp_path / "fs/job/memory.current", "not a number\n")
    group = read_memory_cgroup(str(tmp_path / "proc"), str(tmp_path / "fs"))
    assert group is not None and group.limit is None
    assert group.working_set() is None and group.oom_kills() is None


def test_the_working_set_never_reads_above_the_limit(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/job\n")
    write(tmp_path / "fs/job/memory.high", "1073741824\n")
    write(tmp_path / "fs/job/memory.current", "1200000000\n")  # over memory.high, throttled
    write(tmp_path / "fs/job/memory.stat", "inactive_file 0\n")
    group = read_memory_cgroup(str(tmp_path / "proc"), str(tmp_path / "fs"))
    values = HostSource(cgroup=group).sample()
    assert values["host/limit"] == 2**30 and values["host/working_set"] == 2**30


def test_a_cgroup_without_a_limit_gives_no_working_set(tmp_path: Path) -> None:
    """Without an enforced limit the cgroup's count is every process's in it (a session, a CI
    job running other work): a healthy run was forecast to run out of memory as its
    neighbours grew. The process's own resident set is then the figure."""
    write(tmp_path / "proc", "0::/session\n")
    write(tmp_path / "fs/session/memory.max", "max\n")
    write(tmp_path / "fs/session/memory.current", "9000000000\n")
    write(tmp_path / "fs/session/memory.stat", "inactive_file 0\n")
    group = read_memory_cgroup(str(tmp_path / "proc"), str(tmp_path / "fs"))
    values = HostSource(cgroup=group).sample()
    assert "host/working_set" not in values and values["host/rss"] > 0


def test_process_memory_splits_anonymous_and_file_backed(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  3000 kB\nRssAnon:\t  1000 kB\n"
                      "RssFile:\t  1900 kB\nRssShmem:\t  100 kB\n")  # fmt: skip
    assert process_memory(str(status)) == {"rss": 3_072_000, "anon": 1_024_000, "file": 1_945_600}
    status.write_text("Name:\tpython\n")
    assert process_memory(str(status)) is None


def test_host_source_reads_this_process() -> None:
    values = HostSource().sample()
    assert 0 < values["host/rss"] < values["host/limit"]
    assert values["host/available"] > 0 and values["host/disk_free"] > 0
    assert values["host/swap_used"] >= 0 and values["host/cpu_percent"] >= 0
    assert 0 < values["host/rss_anon"] + values["host/rss_file"] <= values["host/rss"]


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
    series = run_series(server, runs[0]["id"], "host/limit", "host/rss", "host/working_set")
    assert series["host/limit"]["value"] and set(series["host/limit"]["value"]) == {limit}
    assert all(0 < rss < limit for rss in series["host/rss"]["value"])
    # The cgroup's own count: charged here, this process's anonymous memory at least.
    assert all(0 < used < limit for used in series["host/working_set"]["value"])
    env = server.get(f"/api/v1/runs/{runs[0]['id']}")["env"]
    assert env["host"]["memory_limit"] == limit
