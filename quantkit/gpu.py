"""The one nvidia-smi probe: is there an NVIDIA GPU, and how full is it (without importing torch)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypedDict
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from quantkit.records import GpuWindow


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


BUSY_EVERY_MS = 250   # nvidia-smi's own sample period is 1/6 s to 1 s, by product
BUSY_MIN_SAMPLES = 4  # fewer readings in a window say nothing of it
BUSY_WAITS = 85.0     # % of the time a kernel ran: under load, below this the GPU waits on the host
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


class BusyLog:
    """How busy each GPU was, read from nvidia-smi every BUSY_EVERY_MS in a thread:
    utilization.gpu (the share of its last sample period in which a kernel ran) and the SM clock.
    Where the GPU waits on the host (the load client, the server's Python), the share falls and
    tokens/s with it: over 84 repeats at 64 users on five H100s, r = 0.80 (docs/BENCHMARKS.md, "At
    64 users the GPU waits")."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, float, float | None]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index,utilization.gpu,clocks.sm",
             "--format=csv,noheader,nounits", "-lms", str(BUSY_EVERY_MS)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            cells = [c.strip() for c in line.split(",")]
            try:
                index, busy = int(cells[0]), float(cells[1])
            except (ValueError, IndexError):  # a header, "[N/A]", a cut line
                continue
            try:
                sm: float | None = float(cells[2])
            except (ValueError, IndexError):
                sm = None
            self.rows.append((time.time(), index, busy, sm))

    def window(self, t0: float, t1: float) -> GpuWindow | None:
        """The busiest GPU's mean busy share (%) and SM clock (MHz) between two time.time()
        readings (the busiest: the one serving, where others idle beside it); None with fewer
        than BUSY_MIN_SAMPLES readings."""
        per: dict[int, list[tuple[float, float | None]]] = {}
        for t, index, busy, sm in list(self.rows):
            if t0 <= t <= t1:
                per.setdefault(index, []).append((busy, sm))
        seen = [v for v in per.values() if len(v) >= BUSY_MIN_SAMPLES]
        if not seen:
            return None
        best = max(seen, key=lambda v: sum(b for b, _ in v) / len(v))
        clocks = [sm for _, sm in best if sm is not None]
        return {"busy_pct": round(sum(b for b, _ in best) / len(best), 1),
                "sm_mhz": round(sum(clocks) / len(clocks)) if clocks else None,
                "samples": len(best)}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def is_local(url: str) -> bool:
    """`url`'s server runs on this machine (so this machine's GPU is the one serving it)."""
    host = urlsplit(url).hostname or ""
    return host in LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}


@contextmanager
def busy_log(url: str) -> Iterator[BusyLog | None]:
    """A BusyLog while the block runs, where this machine has an NVIDIA GPU and the server at
    `url` runs on it; None elsewhere (a remote server's GPU is not this machine's)."""
    if not is_local(url) or not gpu_present():
        yield None
        return
    log = BusyLog()
    try:
        yield log
    finally:
        log.close()
