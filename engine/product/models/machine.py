"""Facts about this machine that the models' choices read: the memory free on a device and the CPU's name."""
from __future__ import annotations

import platform
from pathlib import Path

import torch


def free_memory(device: str) -> int | None:
    """Bytes free on ``device``: the GPU's free memory, or the host's available RAM; None when unknown."""
    try:
        if device.startswith("cuda"):
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's word for it, else "cpu"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
