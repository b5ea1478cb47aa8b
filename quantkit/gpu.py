"""The one nvidia-smi probe: is there an NVIDIA GPU, and how full is it (without importing torch)."""

from __future__ import annotations

import shutil
import subprocess
from typing import TypedDict


def _smi(*args: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        run = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 and run.stdout.strip() else None


class GpuInfo(TypedDict):
    """What nvidia-smi says of the first GPU: its name, memory used and total (MiB), the compute
    processes on it (pid -> MiB) and how many GPUs are visible."""

    name: str
    used_mib: float
    total_mib: float
    procs: dict[int, float]
    count: int


def gpu_info() -> GpuInfo | None:
    """The first GPU's name, memory used/total and the compute processes on it (MiB); None
    without one."""
    mem = _smi("--query-gpu=name,memory.used,memory.total", "--format=csv,noheader,nounits")
    if mem is None:
        return None
    name, used_s, total_s = mem.splitlines()[0].rsplit(",", 2)
    used, total = float(used_s), float(total_s)
    apps = _smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits") or ""
    procs = {int(p): float(m) for p, m in (ln.split(",") for ln in apps.splitlines()
                                           if ln.count(",") == 1)}
    return {"name": name.strip(), "used_mib": used, "total_mib": total, "procs": procs,
            "count": len(mem.strip().splitlines())}


def gpu_present() -> bool:
    """An NVIDIA GPU is visible."""
    return gpu_info() is not None


def free_share() -> float | None:
    """The first GPU's free memory as a share of its total (what vLLM's
    --gpu-memory-utilization must not exceed at start); None without a GPU."""
    info = gpu_info()
    return None if info is None else 1.0 - info["used_mib"] / info["total_mib"]
