"""The domain test set: perplexity on `text` lines, answers to `prompt` + `answer` lines.

Each JSONL line is {"text": ...} or {"prompt": ..., "answer": ..., "match": "exact"|"contains"|
"regex"}; a line {"default_match": ...} sets the file's default (else "contains").
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict

from quantkit.errors import BadInput

if TYPE_CHECKING:
    from quantkit.validate.served import Served, ThinkSide

MATCHES = ("exact", "contains", "regex")
ANSWER_TOKENS = 64


class DomainRow(TypedDict, total=False):
    """One line of a domain set, checked: a text line (`text`) or a question (`prompt`, `answer`
    and how an output `match`es it); `line` is its line number in the file."""

    kind: Required[str]  # text or qa
    line: Required[int]
    text: str
    prompt: str
    answer: str
    match: str


class QAItem(TypedDict):
    line: int
    output: str
    correct: bool
    answer_nll: float
    think_tokens: NotRequired[int]  # where the model thinks (validate/served.py)
    think_closed: NotRequired[bool]


class QASide(TypedDict):
    accuracy: float
    n: int
    mean_nll: float
    items: list[QAItem]
    thinking: NotRequired[ThinkSide]


class DomainSide(TypedDict, total=False):
    """One model's side of the domain task: perplexity over the text lines, QA over the
    questions (each where the set has them)."""

    ppl: float
    text_lines: int
    tokens: int
    line_nll: list[float]
    qa: QASide


def load_domain_set(path: Path) -> list[DomainRow]:
    """Parse and check every line; BadInput names the file and line of the first bad one."""
    if not Path(path).is_file():
        raise BadInput(f"domain set {path} does not exist", "check the --domain-set path")
    rows: list[DomainRow] = []
    default = "contains"
    for n, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"domain set {path} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: not valid JSON ({exc.msg})",
                           "each line must be one JSON object") from exc
        if not isinstance(row, dict):
            raise BadInput(f"{where}: expected a JSON object", "each line must be one JSON object")
        if set(row) == {"default_match"}:
            default = _match_kind(row["default_match"], where)
            continue
        if isinstance(row.get("text"), str) and row["text"].strip():
            rows.append({"kind": "text", "text": row["text"], "line": n})
        elif isinstance(row.get("prompt"), str) and isinstance(row.get("answer"), str):
            kind = _match_kind(row.get("match", default), where)
            if kind == "regex":
                try:
                    re.compile(row["answer"])
                except re.error as exc:
                    raise BadInput(f"{where}: answer is not a valid regex ({exc})",
                                   "escape it, or use match: contains") from exc
            rows.append({"kind": "qa", "prompt": row["prompt"], "answer": row["answer"],
                         "match": kind, "line": n})
        else:
            raise BadInput(f"{where}: needs a non-empty `text`, or `prompt` and `answer` "
                           f"(has: {', '.join(sorted(map(str, row))) or 'nothing'})",
                           "fix or remove the line")
    if not rows:
        raise BadInput(f"domain set {path} has no lines", "add text or prompt+answer lines")
    return rows


def _match_kind(value: Any, where: str) -> str:
    if value not in MATCHES:
        raise BadInput(f"{where}: unknown match {value!r}", "use one of " + ", ".join(MATCHES))
    return str(value)


def matches(output: str, answer: str, kind: str) -> bool:
    """Whether a generated answer counts as correct."""
    if kind == "exact":
        return output.strip().casefold() == answer.strip().casefold()
    if kind == "regex":
        return re.search(answer, output) is not None
    return answer.strip().casefold() in output.casefold()


def run_domain(engine: Any, rows: list[DomainRow], served: Served | None = None) -> DomainSide:
    """Per-line NLLs of the text lines and graded greedy answers of the QA lines; a thinking
    model (`served`) asked in its served mode, its answer what follows the thinking."""
    out: DomainSide = {}
    texts = [r for r in rows if r["kind"] == "text"]
    if texts:
        line_nll, line_tokens = [], []
        for r in texts:
            nlls = engine.token_nlls(engine.encode(r["text"]))
            line_nll.append(sum(nlls) / max(len(nlls), 1))
            line_tokens.append(len(nlls))
        total = sum(m * n for m, n in zip(line_nll, line_tokens))
        out.update({"ppl": math.exp(total / max(sum(line_tokens), 1)), "text_lines": len(texts),
                    "tokens": sum(line_tokens), "line_nll": line_nll})
    qa = [r for r in rows if r["kind"] == "qa"]
    if qa:
        if served is None:
            prompts = [engine.chat_prompt(r["prompt"]) for r in qa]
            gens = engine.generate_many(prompts, max_tokens=ANSWER_TOKENS, temperature=0.0)
        else:
            prompts = [served.prompt(engine, r["prompt"]) for r in qa]
            gens = engine.generate_many(prompts, temperature=0.0,
                                        max_tokens=served.max_tokens(engine, prompts, ANSWER_TOKENS))
        conts = [engine.encode(r["answer"]) for r in qa]
        lls = engine.loglikelihood([(engine.encode(p), c) for p, c in zip(prompts, conts)])
        items: list[QAItem] = []
        for r, p, g, c, (ll, _) in zip(qa, prompts, gens, conts, lls):
            item: QAItem = {"line": r["line"], "output": g.text, "correct": False,
                            "answer_nll": -ll / max(len(c), 1)}
            answer = g.text
            if served is not None and served.on:
                thought = served.read(engine, p, g.text)
                answer = thought["answer"]
                item["think_tokens"] = thought["think_tokens"]
                item["think_closed"] = thought["think_closed"]
            item["correct"] = matches(answer, r["answer"], r["match"])
            items.append(item)
        out["qa"] = {"accuracy": sum(i["correct"] for i in items) / len(items), "n": len(items),
                     "mean_nll": sum(i["answer_nll"] for i in items) / len(items),
                     "items": items}
        if served is not None and served.on:
            from quantkit.validate.served import think_side, thoughts

            out["qa"]["thinking"] = think_side(thoughts(items))
    return out
