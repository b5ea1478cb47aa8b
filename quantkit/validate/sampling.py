"""The high-temperature sampling check: does the quantized model loop or garble when sampled?

Quantization often leaves greedy answers intact while flattening or skewing the tail of the
next-token distribution; at temperature ~0.9 that shows up as loops, word salad or broken bytes.
Both models sample the same prompts with the same seeds, every output is measured and flagged,
and the verdict is the increase in the flagged share over the baseline.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict, cast

import numpy as np

from quantkit.contract import TaskResult
from quantkit.engines import Engine
from quantkit.errors import BadInput
from quantkit.validate.stats import diff_ci_paired, metric

if TYPE_CHECKING:
    from quantkit.validate.served import Served, ThinkSide

# Thresholds of flags(). Normal sampled prose repeats well under 10% of its 4-grams (code and
# lists reach ~30%), so more than half repeated means the model is re-emitting itself; 32 tokens
# keeps short answers, where one repeated phrase is a large share, out of it.
REPEAT_RATE = 0.5
REPEAT_MIN_TOKENS = 32
# one block back to back >= 3 times over 48 tokens is a sentence or line loop, longer than any
# legitimate pattern (a table rule, "ha ha ha") a short answer contains
LOOP_TOKENS = 48
LOOP_MAX_PERIOD = 64
LOOP_MIN_REPEATS = 3
# fluent text keeps > 0.8 of its word bigrams unique; below 0.3 it is cycling a few words
LOW_DISTINCT_2 = 0.3
LOW_DISTINCT_MIN_WORDS = 32
# a stray control char can come from a code answer; several are broken byte-level decoding
MAX_CONTROL_CHARS = 2
# English prompts get answers in one script, sometimes two (a translation, a Greek letter);
# three or more is token soup from the multilingual part of the vocabulary
MAX_SCRIPTS = 2
# sampled text from a healthy model costs its baseline 1.5-3 nats/token; 6 nats (perplexity
# ~400) is close to random over a 32k-150k vocabulary (10.4-11.9 nats)
IMPLAUSIBLE_NLL = 6.0

# outputs per generate_many call: the transformers engine batches 16 prompts for little more
# than the cost of one on CPU
GEN_CHUNK = 16

BUILTIN_PROMPTS: list[str] = [
    # chat questions
    "What is the difference between weather and climate?",
    "Why do cats purr?",
    "How does a refrigerator keep food cold?",
    "What should I pack for a weekend hiking trip?",
    "Can you explain what inflation is in simple terms?",
    "What are some good habits for getting better sleep?",
    "Why is the sky blue during the day and red at sunset?",
    "How do vaccines train the immune system?",
    "What makes a good first sentence in a cover letter?",
    "Is it better to rent or buy a home? Give both sides.",
    # instructions
    "Write a polite email asking my landlord to fix a leaking tap.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "Give me five tips for learning a new language as an adult.",
    "Rewrite this sentence to sound more formal: gonna be late, sorry!",
    "List the steps to change a flat bicycle tyre.",
    "Explain photosynthesis to a ten-year-old.",
    "Write a short product description for a stainless steel water bottle.",
    "Create a weekly workout plan for a beginner with no equipment.",
    "Draft a two-line apology for missing a meeting.",
    "Translate 'Where is the train station?' into French, Spanish and German.",
    "Give three arguments for and against school uniforms.",
    # code requests
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "Explain what this does: [x * x for x in range(10) if x % 2 == 0]",
    "Write a bash one-liner that counts the lines in every .txt file in a folder.",
    "Write a JavaScript function that debounces another function.",
    "How do I read a CSV file with pandas and drop rows with missing values?",
    "Write a Python class for a stack with push, pop and peek.",
    "What is the difference between a list and a tuple in Python?",
    "Write a regular expression that matches a simple email address.",
    "Explain recursion with a short example in any language.",
    "Write a C function that reverses a linked list.",
    # story starts
    "Continue the story: The lighthouse keeper found a letter with no stamp.",
    "Write the opening paragraph of a mystery set on a night train.",
    "Tell a short bedtime story about a fox who is afraid of the dark.",
    "Continue: When the power went out across the city, Maya heard",
    "Write a short poem about autumn rain.",
    "Describe a bustling market in a desert town at dawn.",
    "Write a dialogue between a robot and a gardener.",
    "Begin a science fiction story in which the moon starts to drift away.",
    "Write a limerick about a forgetful wizard.",
    "Continue the story: The old map had one island that was not on any other map.",
    # facts
    "Who painted the Mona Lisa, and when?",
    "What is the capital of Australia?",
    "How many bones are in the adult human body?",
    "What causes the seasons on Earth?",
    "Name the planets of the solar system in order from the Sun.",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "Who wrote 'Pride and Prejudice'?",
    "What is DNA made of?",
    "When did the first person walk on the Moon?",
    "What is the largest ocean on Earth?",
    "What does the 'www' in a web address stand for?",
    # math word problems
    "A train travels 180 km in 2 hours. What is its average speed?",
    "If 3 notebooks cost $7.50, how much do 8 notebooks cost?",
    "A rectangle is 12 cm long and 5 cm wide. What is its diagonal?",
    "Tom is twice as old as Anna. In 5 years their ages will add up to 43. How old is Anna?",
    "A shop gives 20% off and then another 10% off. What is the total discount?",
    "How many minutes are there in a week?",
    "A tank fills in 6 hours with one pipe and 3 hours with another. How long with both?",
    "What is 15% of 240? Show your steps.",
    "A recipe for 4 people needs 300 g of flour. How much for 10 people?",
    "If you roll two dice, what is the probability that the sum is 7?",
    "A car uses 6 litres per 100 km. How much fuel for a 450 km trip?",
]

_SCRIPT_PREFIX = {"LATIN": "Latin", "CYRILLIC": "Cyrillic", "GREEK": "Greek", "CJK": "CJK",
                  "HIRAGANA": "CJK", "KATAKANA": "CJK", "KATAKANA-HIRAGANA": "CJK",
                  "ARABIC": "Arabic", "HEBREW": "Hebrew", "DEVANAGARI": "Devanagari",
                  "HANGUL": "Hangul", "THAI": "Thai"}
# letter-like symbols (micro sign, script l, math alphanumerics) carry no script
_SYMBOL_PREFIX = {"MICRO", "SCRIPT", "DOUBLE-STRUCK", "BLACK-LETTER", "MATHEMATICAL", "FEMININE",
                  "MASCULINE", "MODIFIER"}
# scripts that share a word in ordinary writing: Greek letters in formulas and units ("πr", "Δx"),
# English terms inside CJK, Korean or Thai text ("Python은", "使用Python")
_COMPATIBLE = {frozenset(p) for p in [("Latin", "Greek"), ("Latin", "CJK"), ("Latin", "Hangul"),
                                      ("Latin", "Thai")]}


@lru_cache(maxsize=8192)
def _script(ch: str) -> str | None:
    """The script of a letter (None for non-letters and letter-like symbols)."""
    if not ch.isalpha():
        return None
    words = unicodedata.name(ch, "").split(" ")
    if words[0] in ("FULLWIDTH", "HALFWIDTH") and len(words) > 1:
        words = words[1:]
    if words[0] in _SYMBOL_PREFIX:
        return None
    return _SCRIPT_PREFIX.get(words[0], "other")


def _longest_run(mask: np.ndarray) -> int:
    """Length of the longest run of True."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max()) if starts.size else 0


def longest_loop(ids: list[int]) -> int:
    """Tokens covered by the longest stretch of one block (1..64 tokens) repeated >= 3 times.

    A stretch is p-periodic exactly where ids[i] == ids[i + p] holds for a run of positions; a run
    of r matches covers r + p tokens and holds >= 3 copies when r >= 2p. O(64 * len) with numpy.
    """
    a = np.asarray(ids, dtype=np.int64)
    best = 0
    for p in range(1, min(LOOP_MAX_PERIOD, len(a) // LOOP_MIN_REPEATS) + 1):
        run = _longest_run(a[p:] == a[:-p])
        if run >= (LOOP_MIN_REPEATS - 1) * p:
            best = max(best, run + p)
    return best


def _distinct(words: list[str], n: int) -> float:
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


class TextMetrics(TypedDict):
    """What one output is measured by (`text_metrics`)."""

    length_tokens: int
    words: int
    repeated_ngram_rate: float
    longest_loop: int
    distinct_2: float
    distinct_3: float
    replacement_chars: int
    control_chars: int
    script_mixing: int
    mixed_script_words: int
    stopped: bool


class Sample(TypedDict, total=False):
    """One sampled output: which prompt and seed, its text and how it finished; once scored its
    metrics, the baseline's NLL of it and its flags (the kept outputs drop `token_ids`)."""

    i: Required[int]
    seed: Required[int]
    prompt: Required[str]
    text: Required[str]
    finish_reason: Required[str]
    token_ids: list[int]
    metrics: TextMetrics
    baseline_nll: float | None
    flags: list[str]
    think_tokens: int  # where the model thinks (validate/served.py)
    think_closed: bool


class SamplingSide(TypedDict):
    """One model's side of the sampling check (`summarize`): what the validation caches."""

    n: int
    flagged: int
    flagged_share: float | None
    flag_counts: dict[str, int]
    means: dict[str, float | None]
    eos_share: float | None
    outputs: list[Sample]
    thinking: NotRequired[ThinkSide]


def text_metrics(text: str, token_ids: list[int], finish_reason: str) -> TextMetrics:
    """Measures of one output; token metrics use token_ids, distinct-n uses whitespace words.

    distinct_2/3 are over case-sensitive whitespace words (tokenizer-independent, so one
    threshold fits every model); 1.0 when there are fewer words than n. script_mixing counts
    the distinct scripts among letters; mixed_script_words counts words whose letters mix
    scripts that do not share words in ordinary writing.
    """
    grams = [tuple(token_ids[i:i + 4]) for i in range(len(token_ids) - 3)]
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    words = text.split()
    scripts: set[str] = set()
    mixed_words = 0
    for word in words:
        found = {s for s in map(_script, word) if s is not None}
        scripts |= found
        known = found - {"other"}
        if len(known) > 1 and not (len(known) == 2 and frozenset(known) in _COMPATIBLE):
            mixed_words += 1
    return {
        "length_tokens": len(token_ids),
        "words": len(words),
        "repeated_ngram_rate": repeated / len(grams) if grams else 0.0,
        "longest_loop": longest_loop(token_ids),
        "distinct_2": _distinct(words, 2),
        "distinct_3": _distinct(words, 3),
        "replacement_chars": text.count("\ufffd"),
        "control_chars": sum(unicodedata.category(c) == "Cc" and c not in "\n\t\r" for c in text),
        "script_mixing": len(scripts),
        "mixed_script_words": mixed_words,
        "stopped": finish_reason in ("eos", "stop"),
    }


def flags(metrics: TextMetrics, baseline_nll: float | None = None) -> list[str]:
    """What went wrong in one output: "repetition", "low_diversity", "garbled", "implausible"."""
    out = []
    if ((metrics["repeated_ngram_rate"] > REPEAT_RATE
         and metrics["length_tokens"] >= REPEAT_MIN_TOKENS)
            or metrics["longest_loop"] >= LOOP_TOKENS):
        out.append("repetition")
    if metrics["distinct_2"] < LOW_DISTINCT_2 and metrics["words"] >= LOW_DISTINCT_MIN_WORDS:
        out.append("low_diversity")
    if (metrics["replacement_chars"] > 0 or metrics["control_chars"] > MAX_CONTROL_CHARS
            or metrics["mixed_script_words"] > 0 or metrics["script_mixing"] > MAX_SCRIPTS):
        out.append("garbled")
    if baseline_nll is not None and baseline_nll > IMPLAUSIBLE_NLL:
        out.append("implausible")
    return out


def output_nll(scorer: Engine, prompt_ids: list[int], output_ids: list[int]) -> float | None:
    """Mean NLL (nats/token) of output_ids after prompt_ids under `scorer`; None if unscorable."""
    if not output_ids:
        return None
    nlls = scorer.token_nlls(list(prompt_ids) + list(output_ids))
    start = len(prompt_ids) - 1  # nlls[k] scores ids[k + 1]
    scored = nlls[max(start, 0):start + len(output_ids)]
    return float(np.mean(scored)) if scored else None


def generate_outputs(engine: Engine, prompts: list[str], *, n: int, temperature: float,
                     top_p: float, max_tokens: int, seed: int,
                     progress: Callable[..., Iterable[Any]] | None = None,
                     served: Served | None = None, seeds: int = 1) -> list[Sample]:
    """n x `seeds` sampled outputs: output i is item i % n, prompt (i % n) % len(prompts)
    through the chat template, seed seed + i (one seed: n outputs, as before --seeds).

    Generation goes through engine.generate_many in chunks of GEN_CHUNK (or the engine's
    `batch_prompts`, where it seeds each request itself, as vLLM does), each called with the
    seed of its first item (llama.cpp then samples item i with seed + i exactly; transformers
    seeds the batch once); the same prompts, settings and seed give the same outputs. `progress`
    has console.progress's signature and advances once per chunk. A thinking model (`served`)
    is asked in its served mode, with the budget more tokens where it thinks.
    """
    if not prompts:
        raise BadInput("the sampling check got no prompts",
                       "pass prompts or use sampling.BUILTIN_PROMPTS")
    if n < 1 or max_tokens < 1:
        raise BadInput(f"the sampling check needs n >= 1 and max_tokens >= 1, got n={n}, "
                       f"max_tokens={max_tokens}")
    size = getattr(engine, "batch_prompts", GEN_CHUNK)  # an engine that batches says how much
    total = n * seeds
    starts: Iterable[int] = range(0, total, size)
    if progress is not None:
        starts = progress(starts, f"sampling {engine.label}", total=-(-total // size))
    outputs: list[Sample] = []
    for start in starts:
        items = range(start, min(total, start + size))
        chunk = [prompts[(i % n) % len(prompts)] for i in items]
        chats = [served.prompt(engine, p) if served else engine.chat_prompt(p) for p in chunk]
        tokens = served.max_tokens(engine, chats, max_tokens) if served else max_tokens
        gens = engine.generate_many(chats, max_tokens=tokens,
                                    temperature=temperature, top_p=top_p, seed=seed + start,
                                    stop=None)
        for i, prompt, gen in zip(items, chunk, gens, strict=True):
            outputs.append({"i": i, "seed": seed + i, "prompt": prompt, "text": gen.text,
                            "token_ids": list(gen.token_ids), "finish_reason": gen.finish_reason})
    return outputs


def score_outputs(outputs: list[Sample], scorer: Engine, served: Served | None = None
                  ) -> list[Sample]:
    """Add metrics, the scorer's mean NLL of each output (output tokens only) and flags.

    The scorer is always the baseline, also for the quantized model's outputs: "implausible"
    means the original model finds the text near random. Where the model thinks (`served`),
    each output also records its thinking (tokens, closed within the budget) and gains the
    thinking flags (validate/think_flags.py: loops over a span, runs of one character,
    unclosed thinking, an empty answer after it).
    """
    prompt_ids: dict[str, list[int]] = {}
    chats: dict[str, str] = {}
    scored: list[Sample] = []
    for o in outputs:
        if o["prompt"] not in prompt_ids:
            chats[o["prompt"]] = (served.prompt(scorer, o["prompt"]) if served
                                  else scorer.chat_prompt(o["prompt"]))
            prompt_ids[o["prompt"]] = scorer.encode(chats[o["prompt"]])
        metrics = text_metrics(o["text"], o["token_ids"], o["finish_reason"])
        nll = output_nll(scorer, prompt_ids[o["prompt"]], o["token_ids"])
        one = o.copy()
        one.update({"metrics": metrics, "baseline_nll": nll, "flags": flags(metrics, nll)})
        if served is not None and served.on:
            from quantkit.validate.think_flags import think_flags

            read = served.read(scorer, chats[o["prompt"]], o["text"])
            one.update({"think_tokens": read["think_tokens"], "think_closed": read["think_closed"],
                        "flags": one["flags"] + think_flags(o["text"], o["token_ids"], read)})
        scored.append(one)
    return scored


def summarize(scored: list[Sample]) -> SamplingSide:
    """Flagged share, flag counts, EOS share and metric means of scored outputs.

    The outputs are kept without their token ids (length_tokens stays in the metrics).
    """
    if not scored:
        return {"n": 0, "flagged": 0, "flagged_share": None, "flag_counts": {}, "means": {},
                "eos_share": None, "outputs": []}
    measured = [cast("Mapping[str, float]", o["metrics"]) for o in scored]
    keys = [k for k, v in measured[0].items() if isinstance(v, (int, float))]
    means: dict[str, float | None] = {k: float(np.mean([m[k] for m in measured])) for k in keys}
    nlls = [o["baseline_nll"] for o in scored if o["baseline_nll"] is not None]
    means["baseline_nll"] = float(np.mean(nlls)) if nlls else None
    counts: dict[str, int] = {}
    for o in scored:
        for f in o["flags"]:
            counts[f] = counts.get(f, 0) + 1
    flagged = sum(bool(o["flags"]) for o in scored)
    return {"n": len(scored), "flagged": flagged, "flagged_share": flagged / len(scored),
            "flag_counts": dict(sorted(counts.items())), "means": means,
            "eos_share": float(np.mean([o["metrics"]["stopped"] for o in scored])),
            "outputs": [_without_ids(o) for o in scored]}


def _without_ids(o: Sample) -> Sample:
    kept = o.copy()
    kept.pop("token_ids", None)
    return kept


def sample_side(engine: Engine, prompts: list[str], *, scorer: Engine | None = None,
                n: int, temperature: float, top_p: float, max_tokens: int, seed: int,
                progress: Callable[..., Iterable[int]] | None = None,
                served: Served | None = None, seeds: int = 1) -> SamplingSide:
    """One model's sampled outputs (n items x `seeds`), scored by `scorer` (the baseline; default
    the model itself) and summarized. The baseline's side is what validation caches."""
    outputs = generate_outputs(engine, prompts, n=n, temperature=temperature, top_p=top_p,
                               max_tokens=max_tokens, seed=seed, progress=progress, served=served,
                               seeds=seeds)
    side = summarize(score_outputs(outputs, scorer or engine, served))
    if served is not None and served.on:
        from quantkit.validate.served import think_side, thoughts

        side["thinking"] = think_side(thoughts(side["outputs"]))
    return side


def sample_check(quantized: Engine, baseline: Engine, prompts: list[str], *, n: int,
                 temperature: float, top_p: float, max_tokens: int,
                 seed: int, progress: Callable[..., Iterable[int]] | None = None,
                 baseline_side: SamplingSide | None = None,
                 served: Served | None = None, seeds: int = 1) -> TaskResult:
    """Both models sample the same prompts with the same seeds; the baseline scores all outputs.

    `flagged_increase` is the quantized flagged share minus the baseline's, with a bootstrap
    interval paired over items and seeds (validate/seeds.py; `seeds` rounds of the n items).
    `baseline_side`: the baseline's `sample_side`, if cached.
    """
    from quantkit.validate.seeds import per_item, spread

    gen: dict[str, Any] = {"n": n, "temperature": temperature, "top_p": top_p,
                           "max_tokens": max_tokens, "seed": seed}
    if seeds > 1 or served is not None:  # recorded where it can be other than one seed
        gen["seeds"] = seeds
    b = baseline_side if baseline_side is not None else sample_side(
        baseline, prompts, progress=progress, served=served, **gen)
    q = sample_side(quantized, prompts, scorer=baseline, progress=progress, served=served, **gen)
    qf = [float(bool(o["flags"])) for o in q["outputs"]]
    bf = [float(bool(o["flags"])) for o in b["outputs"]]
    value, lo, hi = diff_ci_paired(per_item(qf, n), per_item(bf, n), seed=seed)
    metrics = {"flagged_increase": metric(value, lo, hi, len(q["outputs"]))}
    extra: dict[str, Any] = {"settings": {**gen, "prompts": len(prompts)}}
    if seeds > 1:
        extra["seeds"] = {"flagged_share": spread(qf, bf, n)}
    if served is not None:
        extra["thinking"] = served.record()
        if served.on:
            from quantkit.validate.served import think_metrics, thoughts

            tq, tb = thoughts(q["outputs"]), thoughts(b["outputs"])
            metrics.update(think_metrics(tq, tb, seed, items=n))
            if seeds > 1:
                extra["seeds"]["think_closed"] = spread(
                    [float(t["think_closed"]) for t in tq], [float(t["think_closed"]) for t in tb], n)
    return TaskResult(q, b, metrics, extra=extra)
