"""Validating a thinking model as it is served: the mode (auto: the template's default, on, off)
and the thinking budget the generative tasks (HumanEval, the domain QA, the sampling check) run
with; each chat prompt rendered in that mode, the answer scored being what follows the end of the
thinking, and what the thinking cost: whether it closed within the budget, and how long it was.

A model without a thinking mode gets no `Served` (None): its tasks run exactly as before, with
the same prompts, settings and baseline cache keys. Imports no torch, nor numpy until it scores."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from quantkit.errors import BadInput
from quantkit.thinking import Thinking, model_thinking

if TYPE_CHECKING:
    from quantkit.contract import MetricValue, TaskResult

DEFAULT_BUDGET = 2048  # thinking tokens where --thinking-budget is left out (the context's, if less)


class Thought(TypedDict):
    """One generation read as served: the answer after the thinking, the thinking's length in
    tokens (at most the budget where it did not close within it) and whether it closed in time."""

    answer: str
    think_tokens: int
    think_closed: bool


class ThinkSide(TypedDict):
    """One model's thinking over a task's generations: the share that closed within the budget,
    the mean thinking tokens, how many generations."""

    closed: float
    tokens: float
    n: int


@dataclass(frozen=True)
class Served:
    """How a thinking model is run: its template's thinking (`th`), the mode asked and the budget."""

    th: Thinking
    mode: str
    budget: int

    @property
    def on(self) -> bool:
        """Whether the model thinks before it answers in this mode."""
        return self.th.thinks and (self.mode == "on" or self.th.always
                                   or (self.mode == "auto" and self.th.default_on))

    def record(self) -> dict[str, Any]:
        """What results.json's settings (and the caches' keys) hold of it."""
        return {"mode": self.mode, "on": self.on, "budget": self.budget,
                "template_kwargs": self.th.template_kwargs(self.mode),
                "markers": [self.th.start, self.th.end]}

    def prompt(self, engine: Any, user: str) -> str:
        """`user` as one chat turn in this mode (the template's default: the engine's own prompt)."""
        kwargs = self.th.template_kwargs(self.mode)
        return str(engine.chat_prompt(user, **kwargs) if kwargs else engine.chat_prompt(user))

    def max_tokens(self, engine: Any, prompts: Sequence[str], own: int) -> int:
        """New tokens for a task whose answer takes `own`: the budget more where the model thinks,
        within what the context leaves after the longest prompt."""
        if not self.on:
            return own
        room = int(engine.context_length) - max((len(engine.encode(p)) for p in prompts), default=0)
        return max(own, min(own + self.budget, room)) if room > own else own

    def read(self, engine: Any, prompt: str, text: str) -> Thought:
        """The answer of a generated `text` as served: what follows the end of the thinking
        (nothing where it did not close within the budget)."""
        if not self.on:
            return {"answer": text, "think_tokens": 0, "think_closed": True}
        _, answer, closed = self.th.split(text, prompt)
        at = text.find(self.th.end or "\0")
        used = len(engine.encode(text[:at + len(self.th.end or "")] if closed and at >= 0 else text))
        closed = closed and used <= self.budget
        return {"answer": answer if closed else "", "think_tokens": min(used, self.budget),
                "think_closed": closed}


def served_thinking(cfg: Any, model_dir: Path, context: int) -> Served | None:
    """How validation runs the model in `model_dir` (its template read, `cfg`'s --thinking and
    --thinking-budget checked against it and the `context` length); None for a model without a
    thinking mode asked for auto or off: its tasks run as before. BadInput: a mode the template
    lacks, a budget above the context."""
    th = model_thinking(Path(model_dir))
    th.template_kwargs(cfg.thinking)  # a mode this template does not have: BadInput, said once
    budget = cfg.thinking_budget
    if budget is not None and budget > context:
        raise BadInput(f"--thinking-budget {budget} is above the model's context ({context} tokens)",
                       f"use a budget from 1 to {context}")
    if not th.thinks:
        return None
    return Served(th, cfg.thinking, budget if budget is not None else min(DEFAULT_BUDGET, context))


def thoughts(items: Iterable[Mapping[str, Any]]) -> list[Thought]:
    """The thinking of each generated item that records one (its think_tokens, think_closed)."""
    return [{"answer": "", "think_tokens": int(i["think_tokens"]),
             "think_closed": bool(i["think_closed"])} for i in items if "think_closed" in i]


def think_side(items: Sequence[Thought]) -> ThinkSide:
    """The share of `items` whose thinking closed in time and their mean thinking tokens."""
    n = len(items)
    return {"closed": sum(i["think_closed"] for i in items) / n if n else 0.0,
            "tokens": sum(i["think_tokens"] for i in items) / n if n else 0.0, "n": n}


def think_metrics(quant: Sequence[Thought], base: Sequence[Thought], seed: int,
                  items: int = 0) -> dict[str, MetricValue]:
    """The gated comparisons, paired over the items (and seeds: `items` per seed round, each
    item's seeds averaged, validate/seeds.py): `think_closed_drop` (the baseline's share
    closed within the budget minus the quantized model's) and `think_tokens_increase` (mean
    thinking tokens, quantized over baseline, less 1), each with its bootstrap interval."""
    from quantkit.validate.seeds import per_item
    from quantkit.validate.stats import diff_ci_paired, metric, ratio_ci_paired

    n = min(len(quant), len(base))
    qc = per_item([float(i["think_closed"]) for i in quant[:n]], items)
    bc = per_item([float(i["think_closed"]) for i in base[:n]], items)
    qt = per_item([float(i["think_tokens"]) for i in quant[:n]], items)
    bt = per_item([float(i["think_tokens"]) for i in base[:n]], items)
    ratio, lo, hi = ratio_ci_paired(qt, bt, seed=seed)
    return {"think_closed_drop": metric(*diff_ci_paired(bc, qc, seed=seed), n),
            "think_tokens_increase": metric(ratio - 1, lo - 1, hi - 1, n)}


def describe(t: TaskResult, base: Mapping[str, Any] | None = None,
             quant: Mapping[str, Any] | None = None) -> str | None:
    """One line for the task's report section: the mode, the budget, thinking closed on each
    side (`base`, `quant`: the sides' ThinkSide, default each side's `thinking`) and how much
    longer the quantized model thinks (None: the model does not think)."""
    served = t.extra.get("thinking")
    if not isinstance(served, dict):
        return None
    line = f"thinking {'on' if served.get('on') else 'off'} (--thinking {served.get('mode')})"
    if not served.get("on"):
        return line
    line += f", budget {served.get('budget')} tokens"
    b = base if base is not None else (t.baseline or {}).get("thinking")
    q = quant if quant is not None else (t.quantized or {}).get("thinking")
    if b and q:
        line += (f"; thinking closed within it: baseline {b['closed']:.0%}, quantized "
                 f"{q['closed']:.0%}")
    drop = t.metric("think_closed_drop")
    if drop is not None and drop.lo is not None and drop.hi is not None:
        line += f" (drop {drop.value:.0%} [{drop.lo:.0%}, {drop.hi:.0%}])"
    inc = t.metric("think_tokens_increase")
    if inc is not None and inc.lo is not None and inc.hi is not None:
        word = "longer" if inc.value >= 0 else "shorter"
        line += (f"; the quantized model thinks {abs(inc.value):.0%} [{inc.lo:+.0%}, "
                 f"{inc.hi:+.0%}] {word}")
    return line
