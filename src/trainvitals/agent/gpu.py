"""GPU vitals behind one small interface, so tests can drive a simulated device.

A *source* has ``name``, ``describe()`` (a :class:`GpuDescription`, for the run's environment) and
``sample() -> dict[series name, value]``. Sources here:

- :class:`NvmlSource`: every NVIDIA GPU through NVML (``nvidia-ml-py``'s ``pynvml``).
- :class:`TfAllocatorSource`: TensorFlow's allocator bytes per GPU. NVML's "used" stays flat
  once TensorFlow has reserved the card; the allocator's current bytes show a leak.
- :class:`SimulatedGpu`: a scripted device (memory that grows, temperature that rises,
  throttle bits), for tests and demos on machines without a GPU.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Literal, NotRequired, TypedDict

from trainvitals.series import GPU_ECC_UNCORRECTED, GPU_XID_ERRORS, gpu

log = logging.getLogger("trainvitals")

# NVML clock-event (throttle) reason bits, as nvml.h defines them.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40


class GpuCard(TypedDict):
    """One GPU as the run's environment lists it."""

    name: str
    memory_total: int  # bytes


class GpuDescription(TypedDict):
    """What a GPU source tells of the machine (under its name in the run's environment); the
    server's ``env_mismatch`` rule reads the CUDA driver's version from it."""

    gpus: NotRequired[list[GpuCard]]
    driver_version: NotRequired[str]
    cuda_driver_version: NotRequired[str]


class NvmlSource:
    """All GPUs NVML sees. Build with :meth:`create`, which returns None without NVML."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._unsupported: set[tuple[int, str]] = set()
        self._events: Any = None
        try:  # XID errors arrive as events; not every driver or GPU offers them
            self._events = nvml.nvmlEventSetCreate()
            for handle in self._handles:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._events
                )
        except Exception:
            self._events = None
        self._xids = [0] * count

    @classmethod
    def create(cls) -> NvmlSource | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            source = cls(pynvml)
        except Exception as exc:
            log.info("trainvitals: no GPU series: NVML is not available (%s)", exc)
            return None
        if not source._handles:
            log.info("trainvitals: no GPU series: NVML sees no GPU")
            return None
        return source

    def describe(self) -> GpuDescription:
        nvml = self._nvml
        info: GpuDescription = {}
        versions: tuple[tuple[Literal["driver_version", "cuda_driver_version"], str], ...] = (
            ("driver_version", "nvmlSystemGetDriverVersion"),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion"),
        )
        for key, call in versions:
            try:
                info[key] = _text(getattr(nvml, call)())
            except Exception:
                pass
        gpus: list[GpuCard] = []
        for handle in self._handles:
            gpus.append(
                {
                    "name": _text(nvml.nvmlDeviceGetName(handle)),
                    "memory_total": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                }
            )
        info["gpus"] = gpus
        return info

    def sample(self) -> dict[str, float]:
        nvml = self._nvml
        values: dict[str, float] = {}
        for i, handle in enumerate(self._handles):
            prefix = f"gpu{i}/"
            for key, read in _NVML_READINGS.items():
                if (i, key) in self._unsupported:
                    continue
                try:
                    values[prefix + key] = float(read(nvml, handle))
                except Exception:  # NotSupported on this GPU: stop asking
                    self._unsupported.add((i, key))
        self._count_xids()
        for i, count in enumerate(self._xids):
            values[gpu(i, GPU_XID_ERRORS)] = float(count)
        return values

    def _count_xids(self) -> None:
        if self._events is None:
            return
        while True:
            try:
                event = self._nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # timeout: no more events now
                return
            for i, handle in enumerate(self._handles):
                if getattr(event, "device", None) == handle:
                    self._xids[i] += 1


def _throttle_reasons(nvml: Any, handle: Any) -> float:
    # Newer drivers renamed "throttle reasons" to "clocks event reasons".
    reader = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reader = reader or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return float(reader(handle))


#: gpu<i>/<key> -> how NVML reads it.
_NVML_READINGS: dict[str, Callable[[Any, Any], float]] = {
    "mem_used": lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used,
    "mem_total": lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).total,
    "util": lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
    "temp": lambda nvml, h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
    "power": lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW -> W
    "clock_sm": lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
    "throttle": _throttle_reasons,
    GPU_ECC_UNCORRECTED: lambda nvml, h: nvml.nvmlDeviceGetTotalEccErrors(
        h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
    ),
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class TfAllocatorSource:
    """``gpu<i>/tf_current`` and ``gpu<i>/tf_peak`` from TensorFlow's allocator.

    Only when the training script has imported TensorFlow and it sees GPUs.
    """

    name = "tf_allocator"

    def __init__(self, tf: Any, count: int) -> None:
        self._tf = tf
        self._count = count

    @classmethod
    def create(cls) -> TfAllocatorSource | None:
        tf = sys.modules.get("tensorflow")
        if tf is None:
            return None
        try:
            count = len(tf.config.list_physical_devices("GPU"))
        except Exception:
            return None
        return cls(tf, count) if count else None

    def describe(self) -> GpuDescription:
        return {}

    def sample(self) -> dict[str, float]:
        values = {}
        for i in range(self._count):
            info = self._tf.config.experimental.get_memory_info(f"GPU:{i}")
            values[f"gpu{i}/tf_current"] = float(info["current"])
            values[f"gpu{i}/tf_peak"] = float(info["peak"])
        return values


class SimulatedGpu:
    """A scripted GPU: each sample moves it one tick along straight lines.

    Args:
        mem_total: device memory in bytes.
        mem_start, mem_growth: used bytes at tick 0 and added per tick (a leak).
        temp_start, temp_rise: degrees C at tick 0 and added per tick.
        throttle_from: the tick from which thermal throttle bits are set (None: never).
    """

    name = "simulated_gpu"

    def __init__(
        self,
        mem_total: float = 16e9,
        mem_start: float = 2e9,
        mem_growth: float = 0.0,
        temp_start: float = 50.0,
        temp_rise: float = 0.0,
        util: float = 90.0,
        power: float = 250.0,
        clock_sm: float = 1800.0,
        throttle_from: int | None = None,
    ) -> None:
        self.mem_total, self.mem_start, self.mem_growth = mem_total, mem_start, mem_growth
        self.temp_start, self.temp_rise = temp_start, temp_rise
        self.util, self.power, self.clock_sm = util, power, clock_sm
        self.throttle_from = throttle_from
        self.ticks = 0

    def describe(self) -> GpuDescription:
        return {
            "gpus": [{"name": "Simulated GPU", "memory_total": int(self.mem_total)}],
            "driver_version": "simulated",
        }

    def sample(self) -> dict[str, float]:
        tick = self.ticks
        self.ticks += 1
        throttled = self.throttle_from is not None and tick >= self.throttle_from
        used = min(self.mem_start + self.mem_growth * tick, self.mem_total)
        return {
            "gpu0/mem_used": used,
            "gpu0/mem_total": self.mem_total,
            "gpu0/tf_current": used,
            "gpu0/tf_peak": used,
            "gpu0/util": self.util,
            "gpu0/temp": self.temp_start + self.temp_rise * tick,
            "gpu0/power": self.power,
            "gpu0/clock_sm": self.clock_sm * (0.7 if throttled else 1.0),
            "gpu0/throttle": float(THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL if throttled else 0),
        }
