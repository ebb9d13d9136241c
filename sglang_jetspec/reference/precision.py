"""Which dtype the reference engine runs in when asked for `auto`, and why.

bf16 pays on a CPU only where the hardware multiplies bf16 matrices natively (Intel AMX, or the
AVX512-BF16 dot-product instructions); elsewhere PyTorch converts to fp32 around every matmul and
bf16 is slower than fp32. On a GPU bf16 is the serving dtype. fp32 stays the oracle of the identity
tests whatever `auto` picks: they pass `--dtype fp32` or load the target in fp32 themselves.
"""

from __future__ import annotations

import platform
from pathlib import Path

DTYPE_CHOICES = ("auto", "fp32", "bf16", "fp16")
# /proc/cpuinfo flag -> the unit it names, best first
CPU_BF16_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (first `flags` line of /proc/cpuinfo; empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_bf16_unit(flags: set[str]) -> str | None:
    """The CPU's native bf16 matrix unit, if any."""
    return next((unit for flag, unit in CPU_BF16_FLAGS if flag in flags), None)


def resolve_dtype(requested: str, device: str, flags: set[str] | None = None) -> tuple[str, str]:
    """(dtype, reason): `requested` itself unless it is `auto`, which picks bf16 on a GPU or on a CPU
    with native bf16 matrix units, else fp32. The reason goes into every bench/generate header."""
    if requested != "auto":
        return requested, "requested"
    if str(device).startswith("cuda"):
        return "bf16", "auto: GPU"
    unit = cpu_bf16_unit(cpu_flags() if flags is None else flags)
    if unit:
        return "bf16", f"auto: CPU has {unit}"
    return "fp32", "auto: CPU has no AMX-BF16 / AVX512-BF16 (bf16 would be emulated, slower than fp32)"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for benchmark headers."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
