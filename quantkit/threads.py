"""How many CPU threads to compute with: the cores that are idle now, not every core.

torch's OpenMP pool and llama.cpp's thread pool spin at every barrier, so a pool as wide as the
machine, sharing it with another busy process, keeps waiting for a descheduled thread: on a
2-core machine one other CPU-bound process made validation 6x slower instead of 2x. A pool the
size of the idle cores slows down in proportion to the share of the CPU it gets.
"""

from __future__ import annotations

import os

SAMPLE_S = 0.25


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def idle_cores(sample_s: float = SAMPLE_S) -> int:
    """Cores that other processes leave idle, measured over `sample_s` seconds (at least 1)."""
    import psutil

    cores = available_cores()
    try:  # whole cores' worth of work done by others while this process waits
        busy = sum(psutil.cpu_percent(interval=sample_s, percpu=True)) / 100
    except (OSError, RuntimeError):
        return cores
    return max(1, min(cores, round(cores - busy)))


def compute_threads(requested: int = 0) -> int:
    """`requested` when given (> 0), else $QUANTKIT_THREADS, else the idle cores now."""
    if requested > 0:
        return requested
    env = os.environ.get("QUANTKIT_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return idle_cores()


def use_torch_threads(requested: int = 0) -> int:
    """Size torch's intra-op pool by `compute_threads`; returns the number used."""
    import torch

    n = compute_threads(requested)
    torch.set_num_threads(n)
    return n
