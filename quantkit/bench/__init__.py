"""Load-test an OpenAI-compatible server: streamed requests at stepped concurrency -> knee -> report.

Each level sends the same mix of offline prompts with at most `c` requests in flight;
bench_client times every streamed chunk, bench_stats turns the timings into rows and finds the
knee, bench_report draws them. This module parses the inputs, builds the prompts and writes OUT.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quantkit import __version__
from quantkit.bench.client import Prompt, measure, normalize_url
from quantkit.bench.stats import HEADROOM, MIN_GAIN, RequestRecord, find_knee, recommend
from quantkit.config import BenchConfig
from quantkit.errors import BadInput
from quantkit.fsutil import atomic_dir, check_output_dir, write_json

SCHEMA_VERSION = 1
PROMPT_TOKENS = {"short": 32, "medium": 256, "long": 1024}  # approximate, tokenizers differ
DEFAULT_MAX_TOKENS = {"short": 64, "medium": 128, "long": 128}
# Common English words cost ~1.1 tokens each (with punctuation) in 32k-150k vocabularies.
TOKENS_PER_WORD = 1.1
_WORD_TEXT = """time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye
job word business issue side kind head house service friend father power hour game line end
member law car city community name president team minute idea kid body information back parent
face others level office door health person art war history party result change morning reason
research girl guy moment air teacher force education river garden winter summer engine bridge
market island letter music window valley forest harbor kitchen library station signal pattern
measure balance energy silver copper bread stone cloud storm field report method theory model
simple quiet bright early late large small young old green cold warm heavy light sharp gentle
careful sudden ancient modern narrow broad open clear rough smooth strong weak rich honest
build carry follow explain measure remember answer travel gather notice offer protect repair
choose describe discover imagine improve listen prepare provide receive return share suggest
across after along around before behind between beyond during inside through toward under within
often slowly rarely almost always never perhaps together quickly nearly indeed suddenly
"""
WORDS = tuple(_WORD_TEXT.split())


# -- inputs ------------------------------------------------------------------------------------

def parse_concurrency(value: str | Sequence[int]) -> tuple[int, ...]:
    """Levels from `1,2,4` or a sequence: positive integers, ascending, without repeats."""
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        levels = [int(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise BadInput(f"--concurrency {value!r} is not a list of positive integers",
                       "e.g. --concurrency 1,2,4,8,16,32,64")
    return tuple(sorted(set(levels)))


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


# -- prompts -------------------------------------------------------------------------------------

def class_counts(requests: int, mix: Mapping[str, float]) -> dict[str, int]:
    """Requests per class in proportion to the mix (largest remainder, ties to the earlier class)."""
    total = sum(mix.values())
    exact = {k: requests * w / total for k, w in mix.items()}
    counts = {k: int(v) for k, v in exact.items()}
    order = sorted(exact, key=lambda k: (-(exact[k] - counts[k]), list(mix).index(k)))
    for k in order[:requests - sum(counts.values())]:
        counts[k] += 1
    return counts


def build_prompts(requests: int, mix: Mapping[str, float], max_tokens: Mapping[str, int],
                  seed: int = 0, level: int = 0, tokens_per_word: float = TOKENS_PER_WORD
                  ) -> list[Prompt]:
    """`requests` prompts, the same class order for every level, different words per level.

    Different words keep a server's prefix cache from making later levels look faster.
    """
    classes = [k for k, n in class_counts(requests, mix).items() for _ in range(n)]
    random.Random(f"order:{seed}").shuffle(classes)
    return [Prompt(k, prompt_text(k, random.Random(f"text:{seed}:{level}:{i}"), tokens_per_word),
                   max_tokens[k]) for i, k in enumerate(classes)]


def prompt_text(prompt_class: str, rng: random.Random, tokens_per_word: float = TOKENS_PER_WORD
                ) -> str:
    """Word-list prose of about PROMPT_TOKENS[prompt_class] tokens, the task at its end."""
    task = ("Continue the text above." if prompt_class == "short"
            else "Summarize the text above in a few sentences.")
    want = max(8, round(PROMPT_TOKENS[prompt_class] / tokens_per_word) - len(task.split()))
    sentences, words = [], 0
    while words < want:
        n = min(rng.randint(6, 16), want - words)
        sentence = " ".join(rng.choice(WORDS) for _ in range(n))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
        words += n
    return " ".join(sentences) + "\n\n" + task


# -- the stage -----------------------------------------------------------------------------------

def bench(*, cfg: BenchConfig, out: Path | str, force: bool = False) -> dict[str, Any]:
    """Load-test the server at `cfg.url` level by level; write OUT/results.json and report.html."""
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
    def prompts(tokens_per_word: float) -> dict[int, list[Prompt]]:
        return {c: build_prompts(requests, weights, new_tokens, seed, c, tokens_per_word)
                for c in levels}

    run = asyncio.run(measure(base, model, endpoint, api_key, levels, prompts, timeout))
    knee = find_knee(run["levels"], p99_ttft_target=p99_ttft_target,
                     p99_e2e_target=p99_e2e_target)
    counts = class_counts(requests, weights)
    results = {
        "schema_version": SCHEMA_VERSION, "kind": "bench", "quantkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "url": base, "endpoint": endpoint, "model": run["model"],
        "settings": {"requests": requests, "concurrency": list(levels), "mix": weights,
                     "max_tokens": new_tokens, "temperature": 0, "seed": seed,
                     "timeout_s": timeout, "p99_ttft_target_s": p99_ttft_target,
                     "p99_e2e_target_s": p99_e2e_target, "min_gain": MIN_GAIN,
                     "headroom": HEADROOM, "sent_fields": run["sent"],
                     "tokens_per_word": run["tokens_per_word"]},
        "prompts": {k: {"requests_per_level": counts[k], "target_prompt_tokens": PROMPT_TOKENS[k],
                        "mean_prompt_tokens": _mean_prompt_tokens(run["records"], k),
                        "max_tokens": new_tokens[k]} for k in weights},
        "levels": run["levels"], "knee": knee,
        "recommended_concurrency": recommend(knee["concurrency"]),
        "timings": {"warmup_s": round(run["warmup_s"], 3),
                    "total_s": round(time.time() - started, 3)},
    }
    from quantkit.bench.report import render_bench_report

    with atomic_dir(out, force) as tmp:
        write_json(tmp / "results.json", results)
        (tmp / "report.html").write_text(render_bench_report(results), encoding="utf-8")
    return results


def _mean_prompt_tokens(records: Sequence[RequestRecord], prompt_class: str) -> float | None:
    seen = [r.prompt_tokens for r in records
            if r.prompt_class == prompt_class and r.error is None and r.prompt_tokens]
    return round(sum(seen) / len(seen), 1) if seen else None
