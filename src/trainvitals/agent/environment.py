"""What the run's ``hello`` says about where it runs."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Literal, NotRequired, TypedDict

import psutil

from trainvitals.protocol import JobInfo, ProcessInfo


class PythonEnv(TypedDict):
    """The interpreter, the command and the libraries of the training process, as the run's
    ``hello`` carries them in ``env`` (beside what each source describes)."""

    python: str
    platform: str
    executable: str
    argv: list[str]
    cwd: str
    #: Versions of the frameworks the training script imported (none is imported to tell).
    tensorflow: NotRequired[str]
    keras: NotRequired[str]
    numpy: NotRequired[str]


#: The frameworks whose versions :func:`describe` reports when they are loaded.
_FRAMEWORKS: tuple[Literal["tensorflow", "keras", "numpy"], ...] = ("tensorflow", "keras", "numpy")


def describe() -> PythonEnv:
    """Host, process and library versions. Imports nothing heavy: frameworks are only
    reported when the training script already imported them."""
    env: PythonEnv = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
    }
    for module in _FRAMEWORKS:
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None) if loaded else None
        if version:
            env[module] = str(version)
    return env


def job(environ: Mapping[str, str] | None = None) -> JobInfo | None:
    """This process's place in a job of several processes, so that the server shows the
    workers of one job together: ``{"key", "worker", "size", "source"}``, or None for a
    process on its own.

    ``key`` is the same in every process of the job and is taken from, in order:
    ``$TRAINVITALS_JOB`` (any name the launcher gives every worker), ``TF_CONFIG``'s cluster
    (a digest of its addresses) when it has more than one task, or Slurm's job and step ids
    when the step has more than one task. The server links the runs that share a key and
    start together (or while one of them still runs) into one job."""
    environ = os.environ if environ is None else environ
    cluster, task = tf_config(environ.get("TF_CONFIG"))
    tasks = sum(len(addresses) for addresses in cluster.values())
    slurm_tasks = _int(environ.get("SLURM_NTASKS") or environ.get("SLURM_STEP_NUM_TASKS"))
    slurm_rank = _int(environ.get("SLURM_PROCID"))
    worker = f"{task[0]}:{task[1]}" if task else None
    size = tasks or slurm_tasks or None
    explicit = (environ.get("TRAINVITALS_JOB") or "").strip()
    if explicit:
        key, source = explicit[:128], "TRAINVITALS_JOB"
    elif tasks > 1:
        digest = hashlib.sha256(json.dumps(cluster, sort_keys=True).encode()).hexdigest()
        key, source = f"tf_config:{digest[:20]}", "TF_CONFIG"
    elif environ.get("SLURM_JOB_ID") and (slurm_tasks or 0) > 1:
        cluster_name, step = environ.get("SLURM_CLUSTER_NAME", ""), environ.get("SLURM_STEP_ID", "")
        key, source = f"slurm:{cluster_name}:{environ['SLURM_JOB_ID']}.{step}", "slurm"
        size = slurm_tasks
    else:
        return None
    if worker is None:
        worker = f"task:{slurm_rank}" if slurm_rank is not None else f"{host()}:{os.getpid()}"
    return {"key": key, "worker": worker[:64], "size": size, "source": source}


def tf_config(text: str | None) -> tuple[dict[str, list[str]], tuple[str, int] | None]:
    """``TF_CONFIG``'s cluster (task type -> addresses) and this process's (type, index)."""
    if not text:
        return {}, None
    try:
        config = json.loads(text)
        cluster = {
            str(kind): [str(address) for address in addresses]
            for kind, addresses in (config.get("cluster") or {}).items()
            if isinstance(addresses, list)
        }
        task = config.get("task") or {}
        place = (str(task["type"]), int(task.get("index", 0))) if "type" in task else None
        return cluster, place
    except (ValueError, AttributeError, TypeError):
        return {}, None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def host() -> str:
    return socket.gethostname()


def process() -> ProcessInfo:
    """This training process: ``{"key", "started_at"}``. The key (host, pid and the process's
    start time, which tells a pid reused later apart) is the same in every run the process
    makes, so the server links the runs of a loop of fits and judges its memory across them."""
    started = float(psutil.Process().create_time())
    return {"key": f"{host()[:80]}/{os.getpid()}/{started:.2f}", "started_at": started}
