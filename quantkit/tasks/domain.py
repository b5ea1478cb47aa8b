"""Domain, the built-in `--tasks domain`: perplexity, QA retention and the KL of the quantized
model to the original on the user's own test set (--domain-set, JSONL); its option, its
lifecycle and its report section. `quantkit auto` runs it first. The work is
quantkit.validate.domain's (the file, the scoring) and quantkit.validate.kld's. Imports no torch
until it runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.contract import MetricValue, TaskResult
from quantkit.option import opt
from quantkit.task_registry import (
    THINK_METRICS,
    Metric,
    Prepared,
    Task,
    register_task,
    retention,
)

if TYPE_CHECKING:
    from quantkit.results import Results
    from quantkit.validate.domain import DomainRow
    from quantkit.validate.runner import Models, PrepareTask, RunTask, TaskContext, TaskSettings


@dataclass(frozen=True)
class DomainOptions:
    """No `check()`: nothing to check without the file system (prepare reads the file)."""

    domain_set: str | None = opt(None, "JSONL: {text} lines (perplexity) or {prompt, answer"
                                       "[, match]} lines.")


def rows_if_run(cfg: Any, name: str = "domain") -> list[DomainRow] | None:
    """The domain set's rows where the domain task runs (the sampling check's prompts and the
    long-context filler come from them then), else None."""
    return prepare(cfg, name).data if name in cfg.run_tasks else None


def prepare(cfg: Any, name: str) -> Prepared:
    """The domain set, every line parsed and checked."""
    from quantkit.validate.domain import load_domain_set

    return Prepared(load_domain_set(Path(str(cfg.options(name).domain_set))))


def settings(cfg: Any, name: str, data: Any) -> dict[str, Any]:
    return {"domain_set": cfg.options(name).domain_set}


def run_task(models: Models, ctx: TaskContext) -> TaskResult:
    """Perplexity, QA retention and the KL of the quantized model to the original on the
    domain set (the baseline's sides cached)."""
    from quantkit.validate import kld
    from quantkit.validate.domain import run_domain
    from quantkit.validate.runner import cached_baseline
    from quantkit.validate.stats import metric, ppl_ratio_ci, retention_metric

    rows = ctx.data or []
    seed = ctx.cfg.seed
    served = ctx.thinking
    key: list[Any] = [rows] + ([served.record()] if served is not None else [])
    base = cached_baseline(models, ctx.name, key, lambda e: run_domain(e, rows, served))
    quant = run_domain(models.get("quantized"), rows, served)
    metrics: dict[str, MetricValue] = {}
    extra: dict[str, object] = {"file": ctx.options.domain_set}
    if served is not None:
        extra["thinking"] = served.record()
    if "ppl" in quant:
        _, lo, hi = ppl_ratio_ci(quant["line_nll"], base["line_nll"], seed=seed)
        metrics["ppl_increase"] = metric(quant["ppl"] / base["ppl"] - 1, lo - 1, hi - 1,
                                         quant["text_lines"])
    if "qa" in quant:
        q = [float(i["correct"]) for i in quant["qa"]["items"]]
        b = [float(i["correct"]) for i in base["qa"]["items"]]
        metrics["qa_retention"] = retention_metric(q, b, seed=seed)
        if served is not None and served.on:
            from quantkit.validate.served import think_metrics, thoughts

            metrics.update(think_metrics(thoughts(quant["qa"]["items"]),
                                         thoughts(base["qa"]["items"]), seed))
    texts = [r["text"] for r in rows if r["kind"] == "text"]
    if texts:
        side = cached_baseline(models, f"{ctx.name}-kl", [rows, kld.TOP_K],
                               lambda e: kld.baseline_side(e, texts))
        kl = kld.compare(models.get("quantized"), texts, side, seed=seed)
        metrics.update(kl.metrics)
        extra.update(kl.extra)
        from quantkit.engines.choice import ENGINES

        engine = models.pair.engine
        if ENGINES[engine].logprobs == "top-k":  # its prompt logprobs: each position's top k
            extra["kld_rows"] = (f"{engine}: each position's top k, k raised (x8, up to "
                                 f"{kld.MAX_TOP_K}) until the original's top tokens are found; "
                                 "exact where uncovered_mass is 0, else an estimate")
    return TaskResult(quant, base, metrics, extra=extra)


def report_section(t: TaskResult, r: Results | None = None) -> str:
    """Both sides' perplexity and QA, the compared metrics and what the KL was taken over."""
    from quantkit.report.charts import e, interval, kv, num, pct, sig, table
    from quantkit.report.html import section

    q, b = t.quantized or {}, t.baseline or {}
    qa, ba = q.get("qa") or {}, b.get("qa") or {}
    rows = [["perplexity", num(b.get("ppl")), num(q.get("ppl"))],
            ["text lines", num(b.get("text_lines")), num(q.get("text_lines"))]]
    if qa or ba:
        rows += [["QA accuracy", num(ba.get("accuracy")), num(qa.get("accuracy"))],
                 ["QA questions", num(ba.get("n")), num(qa.get("n"))],
                 ["QA mean NLL", num(ba.get("mean_nll")), num(qa.get("mean_nll"))]]
    from quantkit.validate.served import describe

    think = describe(t, ba.get("thinking"), qa.get("thinking"))
    body = (f"<p>File <code>{e(t.extra.get('file'))}</code></p>"
            + (f'<p class="meta">{e(think)}</p>' if think else "")
            + table(["", "baseline", "quantized"], [[r[0]] + [f'<td class="num">{c}</td>'
                                                              for c in r[1:]] for r in rows])
            + kv([("perplexity increase", interval(t.metric("ppl_increase"), pct)),
                  ("QA retention", interval(t.metric("qa_retention"))),
                  ("KL(original ‖ quantized), mean per token", interval(t.metric("kld"), sig)),
                  ("KL, 99th percentile", interval(t.metric("kld_p99"), sig)),
                  ("top-1 agreement", interval(t.metric("top1_agreement"), pct))]))
    if t.metric("kld"):
        tail = (t.extra.get("tail_mass") or {}).get("mean")
        body += (f"<p>KL over {num(t.extra.get('kld_positions'))} token positions: the original's "
                 "256 most likely tokens per position plus one bucket for the rest (a lower bound "
                 f"of the full-vocabulary KL; the rest held {num(tail)} of its mass on average)."
                 "</p>")
    return section("domain", "Domain", body)


register_task(Task(
    "domain", run=run_task, title="Domain", needs="domain_set",
    needs_what="a domain test set", target="domain_set", early=True,
    headline="qa_retention", section=report_section,
    options=DomainOptions,
    prepare=prepare, settings=settings,
    metrics={"ppl_increase": Metric("<=", 0.0, 10.0, "quantized ppl / baseline ppl - 1"),
             "qa_retention": retention("QA accuracy"),
             "kld": Metric("<=", 0.0, 10.0, "mean per-token KL(original || quantized), nats"),
             "kld_p99": Metric("<=", 0.0, 50.0, "99th percentile of the per-token KL, nats"),
             "top1_agreement": Metric(">=", 0.0, 1.0, "share of tokens where both models rank "
                                                      "the same token first"),
             **THINK_METRICS},
    summary=("ppl_increase", "qa_retention", "kld", "top1_agreement", *THINK_METRICS)))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _run: RunTask = run_task
    _prepare: PrepareTask = prepare
    _settings: TaskSettings = settings
