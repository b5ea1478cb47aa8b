"""Long-context retrieval, the built-in `--tasks long_context` (named, never run by default):
facts planted at several depths of documents up to the engine's whole context, retrieved by both
models, gated on the probability each gives the planted fact; its own option
(--long-context-samples) and its lifecycle (its report section is the generic one). The work is
quantkit.validate.longctx's. Imports no torch until it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.contract import TaskResult
from quantkit.errors import BadInput
from quantkit.option import opt
from quantkit.task_registry import Prepared, Task, register_task, retention

if TYPE_CHECKING:
    from quantkit.validate.runner import Models, PrepareTask, RunTask, TaskContext


@dataclass(frozen=True)
class LongContextOptions:
    long_context_samples: int = opt(12, "long_context: documents, at a quarter, half and all of "
                                        "the engine's context, facts at 10/50/90% depth.")

    def check(self) -> None:
        if self.long_context_samples < 1:
            raise BadInput(f"--long-context-samples {self.long_context_samples} must be at least 1",
                           "use e.g. 12")


def prepare(cfg: Any, name: str) -> Prepared:
    """The domain set's rows where the domain task runs (its text lines fill the documents)."""
    from quantkit.tasks.domain import rows_if_run

    return Prepared(rows_if_run(cfg))


def run_task(models: Models, ctx: TaskContext) -> TaskResult:
    """Facts planted in long documents, retrieved by both models on the serving engine (with
    the FP8 KV cache where the artifact carries its scales): retention of retrieval accuracy."""
    import hashlib
    import json
    import math

    from quantkit.validate.longctx import LongContextSide, build_items, filler, run_long_context
    from quantkit.validate.runner import cached_baseline
    from quantkit.validate.stats import retention_metric

    quant = models.get("quantized")
    seed = ctx.cfg.seed
    items = build_items(quant.encode, quant.context_length, filler(ctx.data),
                        ctx.options.long_context_samples, seed)
    digest = hashlib.sha256(json.dumps([[i["ids"], i["answer"]] for i in items]).encode())
    base = cached_baseline(models, ctx.name, [digest.hexdigest()],
                           lambda e: run_long_context(e, items))
    q = run_long_context(quant, items)

    def chance(side: LongContextSide) -> list[float]:
        return [math.exp(r["logprob"]) for r in side["items"]]

    # gated on the probability each model gives the planted code (greedy accuracy flips on near
    # ties where a small model's digits compete; the probability moves smoothly, and a broken
    # cache sends it to ~0); accuracy is reported beside it
    return TaskResult(q, base, {
        "retention": retention_metric(chance(q), chance(base), seed=seed),
        "accuracy_retention": retention_metric([float(r["correct"]) for r in q["items"]],
                                               [float(r["correct"]) for r in base["items"]],
                                               seed=seed)},
        extra={"kv_cache": getattr(quant, "kv_cache", "auto")})


register_task(Task("long_context", run=run_task,
                   title="Long-context retrieval", default=False,
                   options=LongContextOptions,
                   prepare=prepare,
                   metrics={"retention": retention("probability of the planted fact"),
                            "accuracy_retention": retention("greedy retrieval accuracy")},
                   summary=("retention", "accuracy_retention")))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _run: RunTask = run_task
    _prepare: PrepareTask = prepare
