"""How fast models serve under a load: `quantkit serve` each on a free port (the engine `quantkit
serve` picks on this machine: vLLM on a GPU, llama.cpp or transformers on CPU), load-test them with
`quantkit bench` at the given concurrencies in alternating order, over repeats and server starts,
stop them. `quantkit auto --load` measures each candidate that passes, and the original for
reference; a speed is a median with a 95% interval, and a comparison a ratio with its interval."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

from quantkit import console
from quantkit.config import BenchConfig, ServeConfig
from quantkit.errors import BadInput, QuantkitError
from quantkit.records import BenchRepeat, BenchResults, Speed, SpeedLevel


def load_engine(method: str, scfg: ServeConfig | None = None) -> str:
    """The engine `quantkit serve` runs `method`'s candidates with on this machine (vLLM on a GPU,
    llama.cpp for GGUF, transformers for compressed-tensors on CPU): BadInput where none can."""
    from quantkit.engines.choice import choose_engine
    from quantkit.methods import METHODS

    opts = scfg or ServeConfig()
    checkpoint = METHODS[method].checkpoint
    try:
        return choose_engine(checkpoint, opts.engine, "serve", opts)
    except BadInput as exc:
        raise BadInput(f"--load cannot serve {method} candidates here: {exc.message}",
                       exc.hint + "; or leave --load out to choose by size") from None


def measure(model: Path, loads: tuple[int, ...], work: Path, label: str,
            scfg: ServeConfig | None = None, bcfg: BenchConfig | None = None,
            restarts: int | None = None) -> Speed:
    """One model's speed (`measure_servers` of it alone). Raises what `quantkit serve` raised
    when it does not come up."""
    return measure_servers({label: model}, loads, work, scfg, bcfg, restarts, strict=True)[label]


def measure_servers(models: dict[str, Path], loads: tuple[int, ...], work: Path,
                    scfg: ServeConfig | None = None, bcfg: BenchConfig | None = None,
                    restarts: int | None = None, strict: bool = False
                    ) -> dict[str, Speed]:
    """Serve each model with `quantkit serve` (`scfg`'s engine, kernel, memory, context, extra
    arguments) and load-test it with `quantkit bench` at `loads` (`bcfg`'s protocol: repeats,
    seconds, warm-up, prompts), `restarts` server starts each (default 2 on a GPU, 1 on CPU),
    the servers in alternating order (A B, B A, ...: stats.alternating) so a drift in the
    machine's speed falls on all of them. On a GPU one server runs at a time (each takes its
    memory share) and the order alternates per start; on CPU the servers of a start run side by
    side (an idle one takes no CPU) and the order alternates per repeat. Per model: its speed
    (`speed_of`), or {"error"} when its server failed (the others go on; `strict`: raised)."""
    import contextlib
    import dataclasses

    from quantkit.engines.choice import ENGINES
    from quantkit.errors import EngineError
    from quantkit.gpu import gpu_present
    from quantkit.loadtest import bench
    from quantkit.loadtest.stats import alternating, in_round

    opts = scfg or ServeConfig()
    gpu = gpu_present()
    starts = restarts or (2 if gpu else 1)
    base = bcfg or BenchConfig()
    repeats = base.repeats
    work.mkdir(parents=True, exist_ok=True)
    # a GPU engine (auto may choose one) takes its memory share at start: fit it to what is free
    memory = fit_memory(opts.gpu_memory_utilization) if (
        opts.engine == "auto" or ENGINES[opts.engine].gpu) else opts.gpu_memory_utilization
    names = list(models)
    runs: dict[str, list[BenchResults]] = {n: [] for n in names}
    failed: dict[str, QuantkitError] = {}
    urls: dict[str, str] = {}

    def args(label: str) -> list[str]:
        out = ["--allow-unvalidated", "--engine", opts.engine, "--kernel", opts.kernel,
               "--max-num-seqs", str(max(opts.max_num_seqs, max(loads))),
               "--gpu-memory-utilization", str(memory),
               "--log-file", str(work / f"{label}-engine.log")]
        out += ["--ctx-size", str(opts.ctx_size)] if opts.ctx_size else []
        out += opts.own_flags()  # the engines' own (vLLM's --vllm-python)
        return out + [f"--extra-arg={a}" for a in opts.extra_args]

    def run(label: str, seed: int, times: int) -> None:
        out = work / (f"{label}-bench" + (f"-{len(runs[label]) + 1}" if runs[label] else ""))
        cfg = dataclasses.replace(base, url=urls[label], concurrency=loads, seed=seed,
                                  repeats=times)
        console.log(f"{label}: load-testing at {','.join(map(str, loads))} (seed {seed})")
        try:
            runs[label].append(bench(cfg=cfg, out=out, force=True))
        except (EngineError, BadInput) as exc:
            if strict:
                raise
            console.warn(f"{label}: not measured: {exc.message}")
            failed[label] = exc

    def serve(label: str, stack: contextlib.ExitStack) -> None:
        """Start `label`'s server on `stack` (its URL in `urls`), or record why it did not come up
        (the others go on)."""
        t = time.time()
        try:
            urls[label] = stack.enter_context(quantkit_serve(
                models[label], args(label), work / f"{label}-serve.log"))
            console.log(f"{label}: serving after {time.time() - t:.0f} s")
        except (EngineError, BadInput) as exc:
            if strict:
                raise
            console.warn(f"{label}: not measured: {exc.message}")
            failed[label] = exc

    from quantkit.serve.process import quantkit_serve

    for start in range(starts):
        if gpu:  # one server at a time, the order alternating per start
            for label in in_round(names, start):
                with contextlib.ExitStack() as stack:
                    if label not in failed:
                        serve(label, stack)
                    if label in urls:
                        run(label, base.seed + start * repeats, repeats)
                urls.clear()
            continue
        with contextlib.ExitStack() as stack:  # side by side, the order alternating per repeat
            for label in names:
                if label not in failed:
                    serve(label, stack)
            for r in range(repeats):
                k = start * repeats + r
                for label in in_round(names, k):
                    if label not in failed and label in urls:
                        run(label, base.seed + k, 1)
        urls.clear()
    order = alternating(names, starts * (1 if gpu else repeats))
    out: dict[str, Speed] = {}
    for label in names:
        if label in failed:
            out[label] = Speed(error=failed[label].message)
            continue
        out[label] = {**speed_of(runs[label]), "starts": starts, "order": order,
                      "gpu_memory_utilization": memory,
                      "engine": _engine(work / f"{label}-serve.log"),
                      "engine_log": str(work / f"{label}-engine.log"),
                      "url": runs[label][-1]["url"] if runs[label] else None}
    return out


def speed_of(runs: list[BenchResults]) -> Speed:
    """One model's speed from its bench results: per concurrency the median of every repeat's
    output tokens/s, its 95% interval and each figure (`repeats`), TTFT and TPOT P50; the score
    `output_tok_s` (the geometric mean over the concurrencies of those medians), each repeat's
    score (the geometric mean of that repeat's figures) as `repeats`, and their interval `ci`."""
    from quantkit.loadtest.stats import interval, median, spread

    rows: list[SpeedLevel] = []

    by_level: dict[int, list[BenchRepeat]] = {}
    for res in runs:
        for lv in res["levels"]:
            by_level.setdefault(lv["concurrency"], []).extend(lv.get("repeats") or [])
    for c, reps in sorted(by_level.items()):
        tok = [float(r["output_token_throughput"] or 0.0) for r in reps]
        rows.append({"concurrency": c, "output_tok_s": _round(median(tok)), "ci": interval(tok),
                     "repeats": tok, "spread": spread(tok),
                     "ttft_p50_ms": _ms(median([v for r in reps
                                                if (v := r.get("ttft_p50_s")) is not None])),
                     "tpot_p50_ms": _ms(median([v for r in reps
                                                if (v := r.get("tpot_p50_s")) is not None])),
                     "failed": sum(int(r.get("errors") or 0) for r in reps),
                     "gpu_busy_pct": _round(median([v for r in reps
                                                    if (v := r.get("gpu_busy_pct")) is not None]))})
    n = min((len(r["repeats"]) for r in rows), default=0)
    samples = [geomean([r["repeats"][j] for r in rows]) for j in range(n)]
    figures = [v for v in samples if v is not None]
    return {"levels": rows, "output_tok_s": score(rows), "repeats": figures,
            "ci": interval(figures), "spread": spread(figures)}


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


def score(rows: list[SpeedLevel]) -> float | None:
    """Output tokens/s over the levels measured: their geometric mean (None if any is missing)."""
    return geomean([float(r.get("output_tok_s") or 0.0) for r in rows])


def geomean(values: list[float]) -> float | None:
    """The geometric mean of figures, rounded (None: none, or one not positive)."""
    if not values or min(values) <= 0:
        return None
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 2)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
