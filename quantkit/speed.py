"""How fast a model serves under a load: `quantkit serve` it on a free port (the engine production
uses: vLLM on a GPU), load-test it with `quantkit bench` at the given concurrencies, stop it.
`quantkit auto --load` measures each candidate that passes, and the original for reference."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

from quantkit import console
from quantkit.config import BenchConfig, ServeConfig
from quantkit.errors import BadInput


def require_gpu() -> None:
    """--load measures the GPU engine: BadInput on a machine without an NVIDIA GPU."""
    from quantkit.gpu import gpu_present

    if not gpu_present():
        raise BadInput("--load measures serving speed on a GPU and this machine has none "
                       "(nvidia-smi finds no NVIDIA GPU)",
                       "run quantkit auto --load on the GPU machine that will serve, or leave "
                       "--load out to choose by size")


def measure(model: Path, loads: tuple[int, ...], work: Path, label: str,
            scfg: ServeConfig | None = None, bcfg: BenchConfig | None = None) -> dict[str, Any]:
    """Serve `model` (`scfg`'s engine, kernel, memory, context, extra arguments), bench it at
    `loads` (`bcfg`'s prompts and lengths; default: 2 requests per slot of the highest load, at
    least 16); rows per concurrency and the score (output tokens/s, geometric mean over the
    loads). Raises what `quantkit serve` raised when it does not come up."""
    import dataclasses

    from quantkit.loadtest import bench
    from quantkit.serve.process import quantkit_serve

    opts = scfg or ServeConfig()
    work.mkdir(parents=True, exist_ok=True)
    memory = fit_memory(opts.gpu_memory_utilization) if opts.engine in ("auto", "vllm") else (
        opts.gpu_memory_utilization)
    engine_log, serve_log = work / f"{label}-engine.log", work / f"{label}-serve.log"
    args = ["--allow-unvalidated", "--engine", opts.engine, "--kernel", opts.kernel,
            "--max-num-seqs", str(max(opts.max_num_seqs, max(loads))),
            "--gpu-memory-utilization", str(memory),
            "--log-file", str(engine_log)]
    args += ["--ctx-size", str(opts.ctx_size)] if opts.ctx_size else []
    args += ["--vllm-python", opts.vllm_python] if opts.vllm_python else []
    args += [f"--extra-arg={a}" for a in opts.extra_args]
    bcfg = dataclasses.replace(bcfg or BenchConfig(requests=max(16, 2 * max(loads))),
                               url=None, concurrency=loads)
    t = time.time()
    with quantkit_serve(model, args, serve_log) as url:
        console.log(f"{label}: serving after {time.time() - t:.0f} s; load-testing at "
                    f"{','.join(map(str, loads))}")
        res = bench(cfg=dataclasses.replace(bcfg, url=url), out=work / f"{label}-bench",
                    force=True)
    rows = [{"concurrency": lv["concurrency"], "output_tok_s": lv["output_token_throughput"],
             "ttft_p50_ms": _ms((lv.get("ttft_s") or {}).get("p50")),
             "tpot_p50_ms": _ms((lv.get("tpot_s") or {}).get("p50")), "failed": lv["errors"]}
            for lv in res["levels"]]
    return {"levels": rows, "output_tok_s": score(rows), "engine": _engine(serve_log), "url": url,
            "gpu_memory_utilization": memory, "engine_log": str(engine_log)}


def fit_memory(share: float, wait_s: float = 30.0, margin: float = 0.02) -> float:
    """The GPU memory share to serve with: `share`, or less when less is free. vLLM refuses to
    start with less free than its share, and the search's own work holds some: this process's
    CUDA cache (quantizing on the GPU; released here) and the validation engines it has just
    closed, whose processes take seconds to let go (waited for, up to `wait_s`)."""
    import sys

    from quantkit.gpu import free_share

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    deadline = time.time() + wait_s
    free = free_share()
    while free is not None and free - margin < share and time.time() < deadline:
        time.sleep(2)
        free = free_share()
    if free is None or free - margin >= share:
        return share
    fit = round(free - margin, 2)
    if fit < 0.1:
        raise BadInput(f"the GPU has {free:.0%} of its memory free: too little to serve a model "
                       "and measure it", "stop what else runs on the GPU (nvidia-smi lists it)")
    console.warn(f"the GPU has {free:.0%} of its memory free: serving with "
                 f"--gpu-memory-utilization {fit} (not {share})")
    return fit


def _engine(serve_log: Path) -> str | None:
    """The engine `quantkit serve` started (its `starting ENGINE: COMMAND` line)."""
    found = re.search(r"^starting (\S+): ", serve_log.read_text(encoding="utf-8", errors="replace"),
                      re.MULTILINE)
    return found.group(1) if found else None


def score(rows: list[dict[str, Any]]) -> float | None:
    """Output tokens/s over the levels measured: their geometric mean (None if any is missing)."""
    values = [float(r.get("output_tok_s") or 0.0) for r in rows]
    if not values or min(values) <= 0:
        return None
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 2)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)
