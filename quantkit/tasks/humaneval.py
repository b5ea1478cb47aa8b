"""HumanEval, the built-in `--tasks humaneval`: both models' pass@1 on greedy completions, each
program run in a sandbox, and the problems that changed outcome; its own options
(--humaneval-limit, --humaneval-max-tokens, --sandbox), its lifecycle and its report section. The
work (problems, completions, the sandbox) is quantkit.validate.humaneval's and
quantkit.validate.sandbox's. Imports no torch until it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.contract import TaskResult
from quantkit.errors import BadInput
from quantkit.option import opt
from quantkit.task_registry import THINK_METRICS, Prepared, Task, register_task, retention

if TYPE_CHECKING:
    from quantkit.results import Results
    from quantkit.validate.runner import Models, PrepareTask, RunTask, TaskContext, TaskSettings


@dataclass(frozen=True)
class HumanEvalOptions:
    humaneval_limit: int | None = opt(None, "HumanEval problems (default: --limit).")
    humaneval_max_tokens: int = opt(384, "HumanEval: new tokens per completion.")
    sandbox: str = opt("auto", "HumanEval: where the model's programs run: bwrap (namespaces: "
                               "read-only system, no network, no home), basic (process limits "
                               "and a guard; weaker, and said so in the results), or auto: "
                               "bwrap where it works, else basic.")

    def check(self) -> None:
        from quantkit.config.fields import at_least_one, check_range
        from quantkit.validate.sandbox import SANDBOXES

        if self.sandbox not in SANDBOXES:
            raise BadInput(f"unknown --sandbox {self.sandbox!r}", "use " + ", ".join(SANDBOXES))
        at_least_one("humaneval_limit", self.humaneval_limit)
        check_range("humaneval_max_tokens", self.humaneval_max_tokens, 1, 32768)


def problem_limit(cfg: Any, name: str = "humaneval") -> int | None:
    """HumanEval's problem count: its own limit, else the shared --limit."""
    return cfg.options(name).humaneval_limit or cfg.limit


def prepare(cfg: Any, name: str) -> Prepared:
    """The sandbox that will run the programs (auto resolved here), with the warning a weaker one
    carries; --sandbox bwrap that cannot run is BadInput before any model loads."""
    from quantkit.validate.sandbox import resolve_sandbox

    sandbox, warning = resolve_sandbox(cfg.options(name).sandbox)
    return Prepared(sandbox, warning)


def settings(cfg: Any, name: str, data: Any) -> dict[str, Any]:
    """Problems, tokens and the sandbox that ran (the one asked for where HumanEval did not)."""
    opts = cfg.options(name)
    return {"humaneval": {"limit": problem_limit(cfg, name), "max_tokens": opts.humaneval_max_tokens,
                          "sandbox": data or opts.sandbox}}


def run_task(models: Models, ctx: TaskContext) -> TaskResult:
    """Both sides' pass@1 (the baseline's cached), its retention and the problems that changed."""
    from quantkit.validate.humaneval import PROMPT_VERSION, run_humaneval
    from quantkit.validate.runner import cached_baseline
    from quantkit.validate.stats import retention_metric

    he = settings(ctx.cfg, ctx.name, ctx.data)["humaneval"]
    served = ctx.thinking

    def side(engine: Any) -> dict[str, Any]:
        return run_humaneval(engine, limit=he["limit"], max_tokens=he["max_tokens"],
                             sandbox=he["sandbox"], served=served)

    key = {**he, "prompt_version": PROMPT_VERSION,
           **({"thinking": served.record()} if served is not None else {})}
    base = cached_baseline(models, ctx.name, key, side)
    quant = side(models.get("quantized"))
    ids = [i for i in quant["problems"] if i in base["problems"]]
    q = [float(quant["problems"][i]["passed"]) for i in ids]
    b = [float(base["problems"][i]["passed"]) for i in ids]
    changed = [{"task_id": i, "baseline": bool(bb), "quantized": bool(qq)}
               for i, qq, bb in zip(ids, q, b) if qq != bb]
    metrics = {"retention": retention_metric(q, b, seed=ctx.cfg.seed)}
    if "thinking" in quant and "thinking" in base:
        from quantkit.validate.served import think_metrics, thoughts

        metrics.update(think_metrics(thoughts(quant["problems"][i] for i in ids),
                                     thoughts(base["problems"][i] for i in ids), ctx.cfg.seed))
    return TaskResult(quant, base, metrics,
                      extra={"changed": changed, "sandbox": he["sandbox"],
                             **({"sandbox_warning": ctx.warning} if ctx.warning else {}),
                             **({"thinking": served.record()} if served is not None else {})})


def report_section(t: TaskResult, r: Results | None = None) -> str:
    """Both sides' pass@1, the retention, the sandbox and the problems that changed outcome."""
    from quantkit.report.charts import e, interval, kv, num, table
    from quantkit.report.html import section

    q, b = t.quantized or {}, t.baseline or {}
    qp, bp = q.get("problems") or {}, b.get("problems") or {}
    changed = t.extra.get("changed")
    if changed is None:
        changed = [{"task_id": k, "baseline": bp[k].get("passed"), "quantized": qp[k].get("passed")}
                   for k in sorted(qp.keys() & bp.keys())
                   if bp[k].get("passed") != qp[k].get("passed")]
    facts = [("pass@1, baseline", f"{num(b.get('pass_at_1'))} (n={num(b.get('n'))})"),
             ("pass@1, quantized", f"{num(q.get('pass_at_1'))} (n={num(q.get('n'))})"),
             ("retention", interval(t.metric("retention")))]
    sandbox = t.extra.get("sandbox") or q.get("sandbox")
    from quantkit.validate.served import describe

    think = describe(t)
    body = kv(facts + ([("sandbox", e(sandbox))] if sandbox else [])
              + ([("thinking", e(think))] if think else []))
    if t.extra.get("sandbox_warning"):
        body += f'<p class="note"><b>Weaker sandbox.</b> {e(t.extra["sandbox_warning"])}</p>'
    if not changed:
        return section("humaneval", "HumanEval", body + "<p>No problem changed outcome.</p>")
    rows = []
    for c in sorted(changed, key=lambda c: (bool(c.get("quantized")), str(c.get("task_id")))):
        tid = c.get("task_id")
        lost = c.get("baseline") and not c.get("quantized")
        rows.append([f"<code>{e(tid)}</code>",
                     '<span class="bad">passed → failed</span>' if lost
                     else '<span class="ok">failed → passed</span>',
                     e((bp.get(tid) or {}).get("result")), e((qp.get(tid) or {}).get("result"))])
    body += ("<h3>Problems that changed outcome</h3>"
             + table(["problem", "change", "baseline result", "quantized result"], rows))
    return section("humaneval", "HumanEval", body)


register_task(Task("humaneval", run=run_task, title="HumanEval",
                   metrics={"retention": retention("pass@1"), **THINK_METRICS},
                   section=report_section,
                   options=HumanEvalOptions,
                   prepare=prepare,
                   settings=settings, warnings=("sandbox_warning",)))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _run: RunTask = run_task
    _prepare: PrepareTask = prepare
    _settings: TaskSettings = settings
