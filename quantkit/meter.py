"""What a phase cost: its wall time, the peak resident memory of this process and its children
(vLLM's engine core and llama-server are children) and the peak memory in use on the GPU, sampled
by a thread. torch's own counters see one process, and one allocator: vLLM's engine is another
process. Pure at import (no torch); NVML is asked where it is installed, else nvidia-smi."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantkit.records import UsageRecord

GIB = 1024**3


@dataclass
class Usage:
    """A finished (or running) phase's cost; `peak_gpu_gib` is None without a GPU."""

    seconds: float = 0.0
    peak_rss_gib: float = 0.0
    peak_gpu_gib: float | None = None

    def to_dict(self) -> UsageRecord:
        return {"seconds": round(self.seconds, 1), "peak_rss_gib": round(self.peak_rss_gib, 2),
                "peak_gpu_gib": None if self.peak_gpu_gib is None
                else round(self.peak_gpu_gib, 2)}


def tree_rss() -> float:
    """Resident bytes of this process and all its descendants."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return float(total)


def gpu_used_reader(interval: float) -> tuple[Callable[[], float] | None, float]:
    """A function returning the bytes in use on the first GPU (every process's), or None where
    no NVIDIA GPU is visible, and how often to ask it (nvidia-smi: a process a reading, once a
    second at most)."""
    try:
        import pynvml  # nvidia-ml-py: no CUDA context, microseconds a reading

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return (lambda: float(pynvml.nvmlDeviceGetMemoryInfo(handle).used)), interval
    except Exception:  # noqa: BLE001 - not installed, no driver, no GPU: try nvidia-smi
        from quantkit.gpu import gpu_info

        if gpu_info() is None:
            return None, interval

        def smi() -> float:
            info = gpu_info()
            return 0.0 if info is None else info["used_mib"] * 1024**2

        return smi, max(interval, 1.0)


@contextmanager
def meter(interval: float = 0.25) -> Iterator[Usage]:
    """Measure the block: `with meter() as use: ...`, then `use.seconds`, `use.peak_rss_gib`,
    `use.peak_gpu_gib` (filled in when the block ends, also when it raises)."""
    use = Usage()
    gpu, every = gpu_used_reader(interval)
    peaks = {"rss": tree_rss(), "gpu": gpu() if gpu else 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every):
            peaks["rss"] = max(peaks["rss"], tree_rss())
            if gpu is not None:
                peaks["gpu"] = max(peaks["gpu"], gpu())

    thread = threading.Thread(target=sample, name="quantkit-meter", daemon=True)
    t = time.perf_counter()
    thread.start()
    try:
        yield use
    finally:
        done.set()
        thread.join()
        peaks["rss"] = max(peaks["rss"], tree_rss())
        use.seconds = time.perf_counter() - t
        use.peak_rss_gib = peaks["rss"] / GIB
        use.peak_gpu_gib = peaks["gpu"] / GIB if gpu is not None else None
