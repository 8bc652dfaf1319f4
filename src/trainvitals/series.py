"""Every series name the agent records and the detectors and dashboard read.

One place for the names users see on charts and in alerts (``docs/contract.md`` lists them
with their units); ``web/series.js`` mirrors them for the dashboard, and a test keeps the two
equal. Names are plain strings on the wire: these are constants, not an enum, so a user's own
metric names (every Keras log key as-is) travel beside them unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Final

#: The loss of that very batch, taken inside the train step (not Keras's running mean).
LOSS: Final = "loss"
#: A regression's loss at chance on the batch of each of a run's first steps (the
#: ``loss_above_chance`` rule's level; a classifier's comes in the run's ``hello``).
CHANCE_LOSS: Final = "loss_at_chance"
#: How many of a run's first steps record :data:`CHANCE_LOSS`.
CHANCE_STEPS: Final = 100
#: Seconds per training step.
STEP_TIME: Final = "step_time"
#: The optimizer's learning rate, when it exposes one.
LR: Final = "lr"
#: The dynamic loss scale of a ``LossScaleOptimizer`` (mixed float16), at that step.
LOSS_SCALE: Final = "loss_scale"
#: The epoch (1-based), recorded at each epoch's last step, beside ``epoch/<key>`` (Keras's
#: epoch means) and the validation metrics Keras names ``val_<key>``.
EPOCH: Final = "epoch"
EPOCH_PREFIX: Final = "epoch/"
VAL_PREFIX: Final = "val_"

GRAD_GLOBAL_NORM: Final = "grad/global_norm"
#: ``grad/norm/<variable path>``: one variable's gradient norm.
GRAD_NORM_PREFIX: Final = "grad/norm/"

#: ``nonfinite/<origin>``: counts of NaN/Inf elements.
NONFINITE_PREFIX: Final = "nonfinite/"
NONFINITE_LOSS: Final = "nonfinite/loss"
NONFINITE_GRADS: Final = "nonfinite/grads"
NONFINITE_INPUTS: Final = "nonfinite/inputs"
NONFINITE_WEIGHTS: Final = "nonfinite/weights"

#: Process and host readings (bytes, percent), once a second.
HOST_PREFIX: Final = "host/"
#: This process's resident set (``VmRSS``), its anonymous and its file-backed part.
HOST_RSS: Final = "host/rss"
HOST_RSS_ANON: Final = "host/rss_anon"
HOST_RSS_FILE: Final = "host/rss_file"
#: The memory cgroup's working set: what the kernel charges against ``host/limit`` and
#: OOM-kills by (``agent/host.py``); absent where the process has no memory cgroup.
HOST_WORKING_SET: Final = "host/working_set"
HOST_AVAILABLE: Final = "host/available"
HOST_LIMIT: Final = "host/limit"
HOST_SWAP_USED: Final = "host/swap_used"
HOST_CPU_PERCENT: Final = "host/cpu_percent"
HOST_CPU_TEMP: Final = "host/cpu_temp"
HOST_DISK_FREE: Final = "host/disk_free"

#: ``gpu<i>/<field>``: one device's readings, once a second (see :func:`gpu`).
GPU_PREFIX: Final = "gpu"
GPU_MEM_USED: Final = "mem_used"
GPU_MEM_TOTAL: Final = "mem_total"
GPU_TF_CURRENT: Final = "tf_current"
GPU_TF_PEAK: Final = "tf_peak"
GPU_UTIL: Final = "util"
GPU_TEMP: Final = "temp"
GPU_POWER: Final = "power"
GPU_CLOCK_SM: Final = "clock_sm"
GPU_THROTTLE: Final = "throttle"
GPU_ECC_UNCORRECTED: Final = "ecc_uncorrected"
GPU_XID_ERRORS: Final = "xid_errors"


def gpu(index: int, field: str) -> str:
    """The series name of one GPU reading: ``gpu(0, GPU_MEM_USED) == "gpu0/mem_used"``."""
    return f"{GPU_PREFIX}{index}/{field}"


_GPU_MEMORY = re.compile(rf"({GPU_PREFIX}\d+)/({GPU_TF_CURRENT}|{GPU_MEM_USED})$")


def memory_in_use(name: str, present: Container[str]) -> tuple[str, str] | None:
    """``(subject, limit series)`` when ``name`` is a memory's use ("host", "gpu0", ...), else
    None. The host is measured by the cgroup's working set where it reports among ``present``,
    by the process's RSS elsewhere: the RSS counts shared libraries the cgroup does not charge
    and misses the page cache it does. A GPU is measured by TensorFlow's allocator where it
    reports: NVML's "used" is then what TensorFlow reserved at start, most of the card, flat
    while the allocator's own count grows."""
    if name == HOST_WORKING_SET or (name == HOST_RSS and HOST_WORKING_SET not in present):
        return "host", HOST_LIMIT
    match = _GPU_MEMORY.match(name)
    if match is None:
        return None
    device, field = match.groups()
    if field == GPU_MEM_USED and f"{device}/{GPU_TF_CURRENT}" in present:
        return None
    return device, f"{device}/{GPU_MEM_TOTAL}"


def is_system(name: str) -> bool:
    """Readings of the host and GPUs (sampled every second), as opposed to per-step vitals."""
    return name.startswith(HOST_PREFIX) or (
        name.startswith(GPU_PREFIX) and name[len(GPU_PREFIX) : len(GPU_PREFIX) + 1].isdigit()
    )
