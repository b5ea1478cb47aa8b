"""Load-test an OpenAI-compatible server: streamed requests at stepped concurrency -> knee -> report.

Each level sends the same mix of offline prompts with at most `c` requests in flight and times
every streamed chunk; bench_stats turns the timings into rows and finds the knee, bench_report
draws them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from quantkit import __version__, console
from quantkit.bench_stats import (HEADROOM, MIN_GAIN, RequestRecord, find_knee, recommend,
                                  summarize_level)
from quantkit.errors import BadInput, EngineError
from quantkit.fsutil import atomic_dir, check_output_dir, dumps

SCHEMA_VERSION = 1
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_MIX = "short:1,medium:1,long:1"
PROMPT_TOKENS = {"short": 32, "medium": 256, "long": 1024}  # approximate, tokenizers differ
DEFAULT_MAX_TOKENS = {"short": 64, "medium": 128, "long": 128}
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Fields that make the run comparable but that some servers refuse (transformers serve answers
# 422 to ignore_eos); the warm-up request drops the ones a server names in its refusal.
OPTIONAL_FIELDS = {"ignore_eos": True, "stream_options": {"include_usage": True}}
# Common English words tokenize to ~1.15 tokens each (with punctuation) in 32k-150k vocabularies.
TOKENS_PER_WORD = 1.15
WORDS = """time year people way day man thing woman life child world school state family student
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
""".split()


@dataclass(frozen=True)
class Prompt:
    """One request of the benchmark."""

    prompt_class: str
    text: str
    max_tokens: int


@dataclass(frozen=True)
class Target:
    """Where and what to send: the endpoint URL, the model and the request fields every body has."""

    url: str
    endpoint: str
    model: str
    extra: Mapping[str, Any]


# -- inputs ------------------------------------------------------------------------------------

def normalize_url(url: str) -> str:
    """The server's base URL (scheme://host:port[/prefix]) without a trailing / or /v1."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--url {url!r} is not an http(s) URL", "e.g. --url http://127.0.0.1:8000")
    base = url.strip().rstrip("/")
    return base.removesuffix("/v1")


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
    example = DEFAULT_MIX
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
                  seed: int = 0, level: int = 0) -> list[Prompt]:
    """`requests` prompts, the same class order for every level, different words per level.

    Different words keep a server's prefix cache from making later levels look faster.
    """
    classes = [k for k, n in class_counts(requests, mix).items() for _ in range(n)]
    random.Random(f"order:{seed}").shuffle(classes)
    return [Prompt(k, prompt_text(k, random.Random(f"text:{seed}:{level}:{i}")), max_tokens[k])
            for i, k in enumerate(classes)]


def prompt_text(prompt_class: str, rng: random.Random) -> str:
    """Word-list prose of about PROMPT_TOKENS[prompt_class] tokens, the task at its end."""
    task = ("Continue the text above." if prompt_class == "short"
            else "Summarize the text above in a few sentences.")
    want = max(8, round(PROMPT_TOKENS[prompt_class] / TOKENS_PER_WORD) - len(task.split()))
    sentences, words = [], 0
    while words < want:
        n = min(rng.randint(6, 16), want - words)
        sentence = " ".join(rng.choice(WORDS) for _ in range(n))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
        words += n
    return " ".join(sentences) + "\n\n" + task


# -- one streamed request --------------------------------------------------------------------------

def request_body(target: Target, prompt: Prompt, extra: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    body: dict[str, Any] = {"model": target.model, "max_tokens": prompt.max_tokens,
                            "temperature": 0, "stream": True,
                            **(target.extra if extra is None else extra)}
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return body


def _text_of(event: dict[str, Any]) -> str:
    out = []
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        out.append(str(choice.get("text") or delta.get("content") or delta.get("reasoning_content")
                       or delta.get("reasoning") or ""))
    return "".join(out)


async def stream_request(session: Any, target: Target, prompt: Prompt,
                         extra: Mapping[str, Any] | None = None) -> tuple[int | None, RequestRecord]:
    """Send one streamed request; (HTTP status or None, what it measured)."""
    import aiohttp

    perf = time.perf_counter
    start = perf()
    first = last = None
    gaps: list[float] = []
    chunks, usage = 0, None
    try:
        async with session.post(target.url, json=request_body(target, prompt, extra)) as resp:
            if resp.status != 200:
                detail = (await resp.text(errors="replace")).strip()
                return resp.status, RequestRecord(prompt.prompt_class,
                                                  f"HTTP {resp.status}: {detail[:300]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if not isinstance(event, dict) or event.get("error"):
                    error = event.get("error") if isinstance(event, dict) else event
                    return 200, RequestRecord(prompt.prompt_class, f"stream error: {error}"[:300])
                usage = event.get("usage") or usage
                if _text_of(event):
                    now = perf()
                    if last is not None:
                        gaps.append(now - last)
                    first = first if first is not None else now
                    last, chunks = now, chunks + 1
        end = perf()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return None, RequestRecord(prompt.prompt_class, f"{type(exc).__name__}: {exc}"[:300])
    if first is None:
        return 200, RequestRecord(prompt.prompt_class, "the server streamed no text")
    counted = isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)
    return 200, RequestRecord(
        prompt.prompt_class, None, first - start, end - start, tuple(gaps),
        usage["completion_tokens"] if counted else chunks,
        usage.get("prompt_tokens") if isinstance(usage, dict) else None, counted)


async def run_level(session: Any, target: Target, prompts: Sequence[Prompt], concurrency: int
                    ) -> tuple[list[RequestRecord], float]:
    """All prompts with at most `concurrency` in flight; (records, wall seconds)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: Prompt) -> RequestRecord:
        async with gate:
            return (await stream_request(session, target, prompt))[1]

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(one(p)) for p in prompts]
    records = []
    try:
        for done in console.progress(asyncio.as_completed(tasks), f"concurrency {concurrency}",
                                     total=len(tasks)):
            records.append(await done)
    finally:
        for task in tasks:
            task.cancel()
    return records, time.perf_counter() - start
