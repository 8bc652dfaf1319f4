"""Which job of several processes a run belongs to, from what launchers set."""

from __future__ import annotations

import json

from trainvitals.agent.environment import job


def tf_config(index: int, kind: str = "worker", cluster: dict[str, list[str]] | None = None) -> str:
    cluster = cluster or {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def test_workers_of_one_tf_config_cluster_share_a_key_and_say_which_they_are() -> None:
    chief = job({"TF_CONFIG": tf_config(0, "chief")})
    worker = job({"TF_CONFIG": tf_config(1)})
    assert chief is not None and worker is not None
    assert chief["key"] == worker["key"] and chief["key"].startswith("tf_config:")
    assert (chief["worker"], worker["worker"]) == ("chief:0", "worker:1")
    assert chief["size"] == worker["size"] == 3 and chief["source"] == "TF_CONFIG"
    # Another cluster is another job, whatever the order of its keys in the JSON.
    other = job({"TF_CONFIG": tf_config(0, cluster={"worker": ["b:1", "d:1"]})})
    assert other is not None and other["key"] != chief["key"]
    reordered = json.dumps({"task": {"index": 1, "type": "worker"},
                            "cluster": {"worker": ["b:1", "c:1"], "chief": ["a:1"]}})  # fmt: skip
    assert job({"TF_CONFIG": reordered}) == worker


def test_a_process_on_its_own_is_no_job() -> None:
    assert job({}) is None
    assert job({"TF_CONFIG": tf_config(0, cluster={"worker": ["b:1"]})}) is None
    assert job({"TF_CONFIG": "{not json"}) is None
    assert job({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None


def test_slurm_tasks_and_an_explicit_job_name() -> None:
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}
    found = job(slurm)
    assert found == {"key": "slurm::77.0", "worker": "task:2", "size": 4, "source": "slurm"}
    named = job({**slurm, "TRAINVITALS_JOB": "sweep-7", "TF_CONFIG": tf_config(1)})
    assert named == {"key": "sweep-7", "worker": "worker:1", "size": 3, "source": "TRAINVITALS_JOB"}
    alone = job({"TRAINVITALS_JOB": "sweep-7"})
    assert alone is not None and alone["size"] is None and ":" in alone["worker"]  # host:pid
