"""The load test's offline prompts: word-list prose of three lengths, a task at the end, the
same class order at every level and new words per level (so a prefix cache cannot flatter)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One request of the benchmark."""

    prompt_class: str
    text: str
    max_tokens: int


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
                  seed: int = 0, level: int = 0, tokens_per_word: float = TOKENS_PER_WORD,
                  block: int = 0) -> list[Prompt]:
    """`requests` prompts, the same class order for every level, different words per level.

    Different words keep a server's prefix cache from making later levels look faster. `block`
    numbers the further lists of one stream (`prompt_stream`): each has its own order and words.
    """
    classes = [k for k, n in class_counts(requests, mix).items() for _ in range(n)]
    random.Random(f"order:{seed}" + (f":{block}" if block else "")).shuffle(classes)
    first = block * requests
    return [Prompt(k, prompt_text(k, random.Random(f"text:{seed}:{level}:{first + i}"),
                                  tokens_per_word), max_tokens[k])
            for i, k in enumerate(classes)]


def prompt_stream(size: int, mix: Mapping[str, float], max_tokens: Mapping[str, int],
                  seed: int = 0, level: int = 0, tokens_per_word: float = TOKENS_PER_WORD
                  ) -> Iterator[Prompt]:
    """As many prompts as a timed level asks for: lists of `size` (each in the mix's proportions),
    one after another, never a prompt twice. A repeat of a level passes its own seed."""
    for block in itertools.count():
        yield from build_prompts(size, mix, max_tokens, seed, level, tokens_per_word, block)


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
