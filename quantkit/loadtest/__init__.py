"""Load-test an OpenAI-compatible server: streamed requests at stepped concurrency -> knee -> report.

Each level sends the same mix of offline prompts with at most `c` requests in flight;
prompts builds them, client times every streamed chunk, stats turns the timings into rows and
finds the knee, report draws them. This module parses the inputs and writes OUT.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from quantkit import __version__
from quantkit.config import BenchConfig
from quantkit.config.fields import parse_levels
from quantkit.config.serve import MIN_SECONDS_CPU, MIN_SECONDS_GPU
from quantkit.errors import BadInput
from quantkit.fsutil import atomic_dir, check_output_dir, write_json
from quantkit.loadtest.client import WAVES, Protocol, measure
from quantkit.loadtest.prompts import (
    DEFAULT_MAX_TOKENS,
    PROMPT_TOKENS,
    Prompt,
    build_prompts,
    class_counts,
    prompt_stream,
)
from quantkit.loadtest.wire import normalize_url
from quantkit.records import BenchResults

__all__ = ["bench", "build_prompts", "class_counts", "parse_concurrency", "parse_max_tokens",
           "parse_mix"]
from quantkit.loadtest.stats import (
    HEADROOM,
    INTERVAL,
    MIN_GAIN,
    UNSTEADY_SPREAD,
    RequestRecord,
    find_knee,
    recommend,
)

SCHEMA_VERSION = 1
BLOCK = 30  # prompts per list of a level's stream: the mix's proportions hold over each list
# -- inputs ------------------------------------------------------------------------------------

def parse_concurrency(value: str | Sequence[int]) -> tuple[int, ...]:
    """Levels from `1,2,4` or a sequence: positive integers, ascending, without repeats."""
    return parse_levels(value if isinstance(value, str) else list(value), "--concurrency",
                        "--concurrency 1,2,4,8,16,32,64")


def _pairs(value: str, option: str, example: str) -> list[tuple[str, str | None]]:
    pairs = []
    for item in (i.strip() for i in value.split(",")):
        name, sep, number = item.partition(":")
        if name.strip() not in PROMPT_TOKENS:
            raise BadInput(f"{option} {value!r}: unknown prompt class {name.strip()!r}",
                           f"use short, medium or long, e.g. {option} {example}")
        pairs.append((name.strip(), number.strip() if sep else None))
    return pairs


def parse_mix(value: str | Mapping[str, float]) -> dict[str, float]:
    """Class weights from `short:1,medium:1,long:1` (a bare class name weighs 1)."""
    example = str(BenchConfig().mix)  # the one default, shown as the example
    pairs = (list(value.items()) if isinstance(value, Mapping)
             else _pairs(value, "--mix", example))
    mix: dict[str, float] = {}
    for name, weight in pairs:
        try:
            w = 1.0 if weight is None else float(weight)
        except ValueError:
            w = -1.0
        if name not in PROMPT_TOKENS or not 0 <= w < float("inf"):
            raise BadInput(f"--mix {value!r}: {name}:{weight} is not a class and a weight >= 0",
                           f"e.g. --mix {example}")
        mix[name] = w
    if sum(mix.values()) <= 0:
        raise BadInput(f"--mix {value!r} gives every class weight 0", f"e.g. --mix {example}")
    return {k: mix[k] for k in PROMPT_TOKENS if mix.get(k, 0) > 0}


def parse_max_tokens(value: int | str | Mapping[str, int] | None) -> dict[str, int]:
    """New tokens per class: the defaults, one number for all, or `short:64,long:256`."""
    hint = "e.g. --max-tokens 128 or --max-tokens short:64,medium:128,long:256"
    out = dict(DEFAULT_MAX_TOKENS)
    if value is None:
        return out
    if isinstance(value, int) or (isinstance(value, str) and ":" not in value):
        pairs: list[tuple[str, Any]] = [(k, value) for k in out]
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        pairs = _pairs(value, "--max-tokens", "short:64,medium:128,long:256")
    for name, number in pairs:
        try:
            n = int(str(number).strip())
        except ValueError:
            n = 0
        if name not in out or n < 1:
            raise BadInput(f"--max-tokens {value!r} is not a positive integer per class", hint)
        out[name] = n
    return out


# -- the stage -----------------------------------------------------------------------------------

def bench(*, cfg: BenchConfig, out: Path | str, force: bool = False) -> BenchResults:
    """Load-test the server at `cfg.url` level by level; write OUT/results.json and report.html.

    Each level runs `cfg.repeats` times at steady state (client.run_level): a warm-up wave, then
    counted requests for at least `min_seconds` and 4 waves (or `requests`). A level's
    output_token_throughput is the median of its repeats, `output_token_throughput_ci` the 95%
    t-interval of their mean (stats.interval), the same for TTFT and TPOT P50; a level whose
    repeats spread over 10% is `unsteady`; `gpu_busy_pct` how busy the serving GPU was (the median
    of the repeats; where the server runs on this machine's GPU: gpu.busy_log)."""
    cfg.check()
    if cfg.url is None:
        raise BadInput("no server to load-test", "pass --url http://127.0.0.1:8000")
    base = normalize_url(cfg.url)
    levels = parse_concurrency(cfg.concurrency)
    weights = parse_mix(cfg.mix)
    new_tokens = parse_max_tokens(cfg.max_tokens)
    requests, model, endpoint, api_key, seed = (cfg.requests, cfg.model, cfg.endpoint,
                                                 cfg.api_key, cfg.seed)
    timeout, p99_ttft_target, p99_e2e_target = cfg.timeout, cfg.p99_ttft_target, cfg.p99_e2e_target
    out = Path(out)
    check_output_dir(out, force)

    started = time.time()

    def prompts(tokens_per_word: float, level: int, repeat_seed: int) -> Iterator[Prompt]:
        return prompt_stream(requests or max(WAVES * level, BLOCK), weights, new_tokens,
                             repeat_seed, level, tokens_per_word)

    protocol = Protocol(repeats=cfg.repeats, warmup=cfg.warmup, requests=requests,
                        min_seconds=cfg.min_seconds, seed=seed)
    from quantkit.gpu import busy_log

    with busy_log(base) as busy:
        run = asyncio.run(measure(base, model, endpoint, api_key, levels, prompts, timeout,
                                  protocol, min_seconds_for, None if busy is None else busy.window))
    knee = find_knee(run.levels, p99_ttft_target=p99_ttft_target,
                     p99_e2e_target=p99_e2e_target)
    counted = max(1, sum(len(row["repeats"]) for row in run.levels))
    results: BenchResults = {
        "schema_version": SCHEMA_VERSION, "kind": "bench", "quantkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "url": base, "endpoint": endpoint, "model": run.model,
        "settings": {"requests": requests, "concurrency": list(levels), "mix": weights,
                     "max_tokens": new_tokens, "temperature": 0, "seed": seed,
                     "repeats": cfg.repeats, "warmup": cfg.warmup,
                     "min_seconds": run.min_seconds, "waves": WAVES,
                     "interval": INTERVAL, "unsteady_spread": UNSTEADY_SPREAD,
                     "timeout_s": timeout, "p99_ttft_target_s": p99_ttft_target,
                     "p99_e2e_target_s": p99_e2e_target, "min_gain": MIN_GAIN,
                     "headroom": HEADROOM, "sent_fields": run.sent,
                     "tokens_per_word": run.tokens_per_word},
        "prompts": {k: {"requests_per_level": round(sum(
                            r.prompt_class == k for r in run.records) / counted, 1),
                        "target_prompt_tokens": PROMPT_TOKENS[k],
                        "mean_prompt_tokens": _mean_prompt_tokens(run.records, k),
                        "max_tokens": new_tokens[k]} for k in weights},
        "levels": run.levels, "knee": knee,
        "recommended_concurrency": recommend(knee["concurrency"]),
        "unsteady": [row["concurrency"] for row in run.levels if row.get("unsteady")],
        "timings": {"warmup_s": round(run.warmup_s, 3),
                    "total_s": round(time.time() - started, 3)},
    }
    from quantkit.gpu import gpu_info
    from quantkit.loadtest.report import render_bench_report
    from quantkit.roofline import served_roofline

    line = served_roofline(run.card, run.records, run.levels,
                           gpu["name"] if (gpu := gpu_info()) else None)
    results["roofline"] = None if line is None else line.to_dict()

    with atomic_dir(out, force) as tmp:
        write_json(tmp / "results.json", results)
        (tmp / "report.html").write_text(render_bench_report(results), encoding="utf-8")
    return results


def min_seconds_for(card: dict[str, Any]) -> float:
    """--min-seconds when not given: 30 on a GPU engine, 20 on CPU. A GPU engine: the server's
    card names an engine that needs a GPU (quantkit serve's card names it), or this machine has
    an NVIDIA GPU (where quantkit serve puts llama.cpp's layers too); a remote server is judged
    by this machine."""
    from quantkit.engines.choice import ENGINES
    from quantkit.gpu import gpu_present

    spec = ENGINES.get(str(card.get("engine")))
    gpu = (spec is not None and spec.gpu) or gpu_present()
    return MIN_SECONDS_GPU if gpu else MIN_SECONDS_CPU


def _mean_prompt_tokens(records: Sequence[RequestRecord], prompt_class: str) -> float | None:
    seen = [r.prompt_tokens for r in records
            if r.prompt_class == prompt_class and r.error is None and r.prompt_tokens]
    return round(sum(seen) / len(seen), 1) if seen else None
