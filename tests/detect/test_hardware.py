"""Hardware and environment rules: thermal throttling, ECC/XID, CUDA versions, GPUs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.detect.streams import T0, Stream, run_through
from trainvitals.detect import (
    Detector,
)
from trainvitals.protocol import Columns

# -- hardware ------------------------------------------------------------------------------


def test_thermal_throttling_and_hardware_errors_on_a_gpu() -> None:
    seconds = range(30)

    def gpu(
        **values: Callable[[int], float],
    ) -> Stream:
        return {
            f"gpu0/{k}": Columns([5] * 30, [T0 + t for t in seconds], [fn(t) for t in seconds])
            for k, fn in values.items()
        }

    book, changes = run_through(
        Detector(),
        gpu(
            temp=lambda t: 70 + t,
            throttle=lambda t: 0x20 if t >= 10 else 0x4,
            ecc_uncorrected=lambda t: 2 if t >= 20 else 0,
            xid_errors=lambda t: 0,
        ),
    )
    assert ("fired", "thermal", "warning", 5) in changes
    assert ("fired", "hardware", "critical", 5) in changes
    assert book.alerts[("thermal", "gpu0")].severity == "critical"  # 92 degrees at t=22
    assert book.alerts[("hardware", "gpu0")].evidence["count"] == 2


@pytest.mark.parametrize(
    ("tf_cuda", "driver", "severity"),
    [("12.5.1", "12040", "warning"), ("12.3", "11080", "critical"), ("12.3", "12040", None)],
)
def test_cuda_the_build_expects_against_the_driver(
    tf_cuda: str, driver: str, severity: str | None
) -> None:
    env = {
        "tensorflow": "2.21.0",
        "tf_build": {"cuda_version": tf_cuda, "is_cuda_build": True},
        "tf_gpus": ["/physical_device:GPU:0"],
        "nvml": {"cuda_driver_version": driver, "gpus": [{"name": "H100"}]},
    }
    findings = Detector(env=env).hello(0, T0)
    assert [f.severity for f in findings] == ([severity] if severity else [])


def test_gpus_tensorflow_cannot_see() -> None:
    env = {
        "tf_build": {"cuda_version": "12.5", "is_cuda_build": True},
        "tf_gpus": [],
        "nvml": {"cuda_driver_version": "12080", "gpus": [{"name": "A100"}]},
    }
    (finding,) = Detector(env=env).hello(0, T0)
    assert finding.severity == "critical" and "TensorFlow sees none" in finding.message
