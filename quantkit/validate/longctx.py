"""The long-context task: facts planted at several depths of long documents, retrieved at the end.

A document is domain text (the domain set's text lines, else the standard library's docstrings)
cut to a length, with a few facts ("The access code of the green heron is 4821.") planted at
depths; the question at the end asks for one of them. Scored as retrieval: the engine's greedy
continuation of the question is exactly the planted code (`Engine.loglikelihood`'s is-greedy),
with the code's log-probability beside it. Lengths are shares of the engine's context, so the
documents reach the context the model is served with: what an FP8 KV cache (or a quantized
attention) can lose, and short tasks never see.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from quantkit.validate.domain import DomainRow

COLORS = ("green", "amber", "violet", "silver", "crimson", "teal", "ochre", "indigo")
ANIMALS = ("heron", "lynx", "otter", "falcon", "badger", "gecko", "marten", "ibis")
DEPTHS = (0.1, 0.5, 0.9)
SHARES = (0.25, 0.5, 1.0)  # document lengths, as shares of the context
FACTS_PER_DOC = 3


class LongContextItem(TypedDict):
    """One document: its prompt's token ids (facts planted in filler, then the question), the
    planted code's, its length and the depth of the asked fact."""

    ids: list[int]
    answer: list[int]
    length: int
    depth: float


class Retrieval(TypedDict):
    length: int
    depth: float
    correct: bool
    logprob: float


class LongContextSide(TypedDict):
    accuracy: float
    mean_logprob: float
    by_depth: dict[str, float]
    max_length: int
    items: list[Retrieval]


def filler(rows: list[DomainRow] | None) -> list[str]:
    """The text documents are built from: the domain set's text lines, else stdlib docstrings."""
    texts = [r["text"] for r in rows or [] if r.get("kind") == "text" and r.get("text")]
    if texts:
        return texts
    from quantkit.sources import parse_source, read_documents

    return [d.text for d in read_documents(parse_source("builtin:stdlib-docs"))][:2000]


def build_items(encode: Any, context: int, texts: list[str], samples: int, seed: int
                ) -> list[LongContextItem]:
    """`samples` documents (token ids of the prompt and of the answer), spread over lengths and
    depths; the same for both models (ids from the baseline's tokenizer, which the quantized
    model shares)."""
    rng = random.Random(seed)
    pool = [t for t in texts if t.strip()]
    items: list[LongContextItem] = []
    for n in range(samples):
        share, depth = SHARES[n % len(SHARES)], DEPTHS[(n // len(SHARES)) % len(DEPTHS)]
        names = rng.sample([(c, a) for c in COLORS for a in ANIMALS], FACTS_PER_DOC)
        codes = [str(rng.randint(1000, 9999)) for _ in names]
        ask = rng.randrange(FACTS_PER_DOC)
        facts = [encode(f" The access code of the {c} {a} is {code}. ")
                 for (c, a), code in zip(names, codes)]
        question = encode(f"\n\nQuestion: what is the access code of the {names[ask][0]} "
                          f"{names[ask][1]}?\nAnswer: The access code of the {names[ask][0]} "
                          f"{names[ask][1]} is")
        answer = encode(f" {codes[ask]}")
        budget = max(64, int(context * share) - len(question) - len(answer) - sum(map(len, facts)))
        body: list[int] = []
        while len(body) < budget:
            body += encode(" " + pool[rng.randrange(len(pool))].strip())
        body = body[:budget]
        # the asked fact at this item's depth, the others at random places
        placed = {int(budget * depth): facts[ask]}
        for i in range(FACTS_PER_DOC):
            spot = rng.randrange(budget)  # drawn for the asked fact too: the documents' seed
            if i == ask:
                continue
            while spot in placed:
                spot = rng.randrange(budget)
            placed[spot] = facts[i]
        ids: list[int] = []
        last = 0
        for spot in sorted(placed):
            ids += body[last:spot] + placed[spot]
            last = spot
        ids += body[last:] + question
        items.append({"ids": ids, "answer": answer, "length": len(ids) + len(answer),
                      "depth": depth})
    return items


def run_long_context(engine: Any, items: list[LongContextItem]) -> LongContextSide:
    """Each item's retrieval (greedy continuation == the planted code) and the code's
    log-probability; accuracy overall and by depth."""
    scored = engine.loglikelihood([(it["ids"], it["answer"]) for it in items])
    rows: list[Retrieval] = [{"length": it["length"], "depth": it["depth"],
                              "correct": bool(greedy), "logprob": round(float(lp), 4)}
                             for it, (lp, greedy) in zip(items, scored)]
    by_depth = {str(d): sum(r["correct"] for r in rows if r["depth"] == d)
                / max(1, sum(1 for r in rows if r["depth"] == d)) for d in DEPTHS}
    return {"accuracy": sum(r["correct"] for r in rows) / max(1, len(rows)),
            "mean_logprob": sum(r["logprob"] for r in rows) / max(1, len(rows)),
            "by_depth": by_depth, "max_length": max((r["length"] for r in rows), default=0),
            "items": rows}
