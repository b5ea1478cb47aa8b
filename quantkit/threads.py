"""How the CPU computes: with how many threads (the cores that are idle now, not every core),
and in which dtype (bfloat16 where the CPU multiplies it natively, else float32).

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


CPU_DTYPES = ("float32", "bfloat16")


def cpu_dtype(model_dtype: str = "bfloat16") -> str:
    """The dtype validation's and the importance matrix's forward passes of a `model_dtype` model
    run in on this CPU: a float32 model's own; any other in $QUANTKIT_CPU_DTYPE where set
    (float32 for reference numerics), else in bfloat16 where the CPU multiplies it in hardware
    (AMX or AVX512-BF16: MMLU on the demo model 1.9x faster on a 2-core AMX machine, its domain
    KL 0.0299 against float32's 0.0272, docs/BENCHMARKS.md), else in float32 (16-bit matmuls
    without them are many times slower). A GPU computes such a model in 16 bits anyway; this
    is the CPU's match to it. (Quantization's own passes stay float32 on a CPU:
    layerwise.Plan.compute_dtype.)"""
    env = os.environ.get("QUANTKIT_CPU_DTYPE", "")
    if env and env not in CPU_DTYPES:
        from quantkit.errors import BadInput

        raise BadInput(f"QUANTKIT_CPU_DTYPE={env} is not one of {', '.join(CPU_DTYPES)}",
                       "unset it (the CPU's own choice), or set float32 or bfloat16")
    if model_dtype == "float32":
        return "float32"
    if env:
        return env
    import torch

    native = (getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
              or getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
    return "bfloat16" if native else "float32"
