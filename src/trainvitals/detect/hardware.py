"""Rules on the GPU and the software stack: heat, hardware errors, version mismatches."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainvitals.detect import settings as s
from trainvitals.detect.base import Context, Rule, finite
from trainvitals.detect.evidence import ThermalEvidence
from trainvitals.detect.types import Finding, Record, Severity
from trainvitals.series import GPU_ECC_UNCORRECTED, GPU_XID_ERRORS

# NVML clock-event (throttle) reasons: bits as nvml.h defines them.
THROTTLE_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
_THERMAL_BITS = 0x8 | 0x20 | 0x40 | 0x80
_HARDWARE_BITS = 0x8 | 0x40 | 0x80
_GPU = re.compile(r"(gpu\d+)/(temp|throttle|ecc_uncorrected|xid_errors)$")

THERMAL_HINT = (
    "The GPU slows itself down to cool: check the fans, the airflow and the room, and "
    "whether other jobs share the card; lowering the power limit (`nvidia-smi -pl`) trades "
    "a little speed for steady clocks. Steps will be slower while it lasts."
)
HARDWARE_HINT = (
    "The GPU reports hardware errors: results may be corrupt and a crash may follow. Drain "
    "this GPU, check `nvidia-smi -q -d ECC,PAGE_RETIREMENT` and `dmesg | grep -i xid`, and "
    "resume from a checkpoint on another device."
)


def throttle_reasons(bits: float) -> list[str]:
    value = int(bits)
    return [name for bit, name in THROTTLE_REASONS.items() if value & bit]


class ThermalRule(Rule):
    """GPU temperature high, or thermal/power-brake throttling active, for a while."""

    id = "thermal"
    watches = ("gpu",)

    def __init__(self, context: Context, settings: s.Thermal) -> None:
        super().__init__(context)
        self.settings = settings
        self._counts: dict[str, int] = {}

    def observe(self, record: Record) -> list[Finding]:
        cfg = self.settings
        out = []
        gpus = {m.group(1) for n in record.values if (m := _GPU.match(n)) and m.group(2) == "temp"}
        gpus |= {
            m.group(1) for n in record.values if (m := _GPU.match(n)) and m.group(2) == "throttle"
        }
        for gpu in sorted(gpus):
            temp = record.values.get(f"{gpu}/temp")
            bits = int(record.values.get(f"{gpu}/throttle") or 0)
            thermal = bits & _THERMAL_BITS
            hot = bool(thermal) or (finite(temp) and temp >= cfg.warning_temp)  # type: ignore[operator]
            severity: Severity = (
                "critical"
                if (finite(temp) and temp >= cfg.critical_temp) or bits & _HARDWARE_BITS  # type: ignore[operator]
                else "warning"
            )
            count = self._counts.get(gpu, 0)
            count = max(count, 0) + 1 if hot else min(count, 0) - 1
            self._counts[gpu] = count
            current = self.firing.get(gpu)
            if hot and count >= cfg.sustain and current != severity and current != "critical":
                reasons = throttle_reasons(thermal)
                message = f"{gpu.upper()} is hot"
                if finite(temp):
                    message += f" ({temp:.0f} °C)"
                if reasons:
                    message += " and throttled: " + ", ".join(reasons)
                evidence: ThermalEvidence = {"temp": temp, "throttle": bits, "reasons": reasons}
                clock = self.context.latest.get(f"{gpu}/clock_sm")
                if clock is not None:
                    evidence["clock_sm"] = clock
                out.append(self.fire(gpu, record, severity, message, THERMAL_HINT, evidence))
            elif current is not None and -count >= cfg.sustain:
                out.append(self.resolve(gpu, record))
        return out


class HardwareRule(Rule):
    """Uncorrected ECC errors or XID events counted since the run started."""

    id = "hardware"
    watches = ("gpu",)

    def __init__(self, context: Context, settings: s.Hardware) -> None:
        super().__init__(context)
        self._first: dict[str, float] = {}
        self._reported: dict[str, float] = {}

    def observe(self, record: Record) -> list[Finding]:
        out = []
        for name, value in record.values.items():
            match = _GPU.match(name)
            if match is None or match.group(2) not in (GPU_ECC_UNCORRECTED, GPU_XID_ERRORS):
                continue
            if not finite(value):
                continue
            first = self._first.setdefault(name, value if "ecc" in name else 0.0)
            new = value - first
            if new > 0 and value > self._reported.get(name, first):
                self._reported[name] = value
                gpu = match.group(1)
                what = "uncorrected ECC errors" if "ecc" in name else "XID errors"
                message = f"{gpu.upper()} reported {new:.0f} {what} during this run"
                evidence = {"series": name, "count": new, "total": value}
                out.append(self.fire(gpu, record, "critical", message, HARDWARE_HINT, evidence))
        return out


def _version(text: Any) -> tuple[int, int] | None:
    """``"12.5.1"`` or NVML's ``12040`` as (major, minor)."""
    raw = str(text or "").strip()
    if not raw:
        return None
    if raw.isdigit():
        number = int(raw)
        return (number // 1000, (number % 1000) // 10)
    parts = re.findall(r"\d+", raw)
    if len(parts) < 2:
        return None
    return int(parts[0]), int(parts[1])


class EnvMismatchRule(Rule):
    """The CUDA the TensorFlow build expects against what the driver supports; GPUs the
    driver sees but TensorFlow doesn't."""

    id = "env_mismatch"

    def __init__(self, context: Context, settings: s.EnvMismatch) -> None:
        super().__init__(context)

    def check(self, env: Mapping[str, Any], step: int, time: float) -> list[Finding]:
        record = Record(step, time, {})
        build = env.get("tf_build") or {}
        nvml = env.get("nvml") or {}
        driver_gpus = nvml.get("gpus") or []
        tf_gpus = env.get("tf_gpus")
        wanted = _version(build.get("cuda_version"))
        supported = _version(nvml.get("cuda_driver_version"))
        evidence = {
            "tensorflow": env.get("tensorflow"),
            "tf_cuda": build.get("cuda_version"),
            "tf_cudnn": build.get("cudnn_version"),
            "driver": nvml.get("driver_version"),
            "driver_cuda": supported and f"{supported[0]}.{supported[1]}",
            "driver_gpus": len(driver_gpus),
            "tf_gpus": tf_gpus,
        }
        if wanted and supported and wanted > supported:
            severity: Severity = "critical" if wanted[0] > supported[0] else "warning"
            message = (
                f"TensorFlow {env.get('tensorflow', '')} was built for CUDA "
                f"{wanted[0]}.{wanted[1]}, but the driver supports CUDA up to "
                f"{supported[0]}.{supported[1]}"
            )
            hint = (
                "Upgrade the NVIDIA driver to one that supports the CUDA version the build "
                "expects, or install the TensorFlow release built for your driver's CUDA "
                "(see tensorflow.org/install/source#gpu for the tested pairs)."
            )
            return [self.fire("cuda", record, severity, message, hint, evidence)]
        if driver_gpus and tf_gpus == [] and build.get("is_cuda_build", True):
            message = (
                f"The driver sees {len(driver_gpus)} GPU(s) but TensorFlow sees none: "
                "training runs on the CPU"
            )
            hint = (
                "TensorFlow could not load CUDA or cuDNN: install `tensorflow[and-cuda]` (or "
                "the CUDA/cuDNN versions the build expects), check CUDA_VISIBLE_DEVICES, and "
                "read TensorFlow's start-up log for the library it failed to load."
            )
            return [self.fire("gpu", record, "critical", message, hint, evidence)]
        if driver_gpus and build and build.get("is_cuda_build") is False:
            message = "A CPU-only TensorFlow build runs on a machine with GPUs"
            hint = "Install the GPU build (`pip install tensorflow[and-cuda]`)."
            return [self.fire("gpu", record, "warning", message, hint, evidence)]
        return []
