"""Where a run ran: what ``summary.json`` records so that two runs' last digits can be compared.

The last bits of a float result depend on the kernels the machine picks (a CPU's vector extensions, the
intra-op thread count, the torch build, the GPU); quantized exchanges (FP4) can amplify such a difference
into the third decimal of a final loss. This records what picks them.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from typing import Any

import torch

#: /proc/cpuinfo flags that decide which vector kernels run (the rest is noise for this purpose).
_VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "sve",
)


@lru_cache(maxsize=1)
def _cpu() -> tuple[str, list[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and value.strip():
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:  # not Linux: the platform module's answer
        pass
    return model, [f for f in _VECTOR_FLAGS if f in flags]


def environment(*, device: str) -> dict[str, Any]:
    """torch and Python versions, CPU model, its vector extensions and torch's CPU capability, intra-op
    threads, and the device (with the GPU's name where it is one)."""
    model, flags = _cpu()
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": model,
        "cpu_vector_extensions": flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "intra_op_threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


__all__ = ["environment"]
