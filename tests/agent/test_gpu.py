"""NvmlSource's mapping from NVML calls to series, with a stand-in for the NVML library
(this machine has no NVIDIA driver; the real path is checked on a GPU machine)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from trainvitals.agent.gpu import NvmlSource


class NotSupported(Exception):
    pass


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.pending_xids: list[Any] = []

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: str, kind: int, events: str) -> None:
        pass

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:
        if not self.pending_xids:
            raise TimeoutError
        return self.pending_xids.pop()

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=3e9 if h == "h0" else 1e9, total=80e9)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=97)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 83

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 612_000  # milliwatts

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return 1755

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return 0x20

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        raise NotSupported("ECC off")

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"560.35"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12060

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H100"


def test_nvml_readings_become_gpu_series() -> None:
    nvml = FakeNvml()
    source = NvmlSource(nvml)
    nvml.pending_xids.append(SimpleNamespace(device="h1"))
    values = source.sample()
    assert values["gpu0/mem_used"] == 3e9 and values["gpu1/mem_used"] == 1e9
    assert values["gpu0/mem_total"] == 80e9 and values["gpu0/util"] == 97
    assert values["gpu0/temp"] == 83 and values["gpu0/power"] == 612.0
    assert values["gpu0/clock_sm"] == 1755 and values["gpu0/throttle"] == 0x20
    assert "gpu0/ecc_uncorrected" not in values  # not supported: left out, not an error
    assert (values["gpu0/xid_errors"], values["gpu1/xid_errors"]) == (0, 1)
    info = source.describe()
    assert info["driver_version"] == "560.35" and info["cuda_driver_version"] == "12060"
    assert info["gpus"] == [{"name": "NVIDIA H100", "memory_total": 80_000_000_000}] * 2
