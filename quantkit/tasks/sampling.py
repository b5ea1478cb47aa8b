"""The sampling check, the built-in `--tasks sampling`: both models sample the same prompts at a
high temperature with the same seeds, every output is measured and flagged (loops, word salad,
broken bytes), and the gate reads the increase in the flagged share; its own options (--samples,
--temperature, --top-p, --max-tokens), its lifecycle and its report section (the flagged pairs
side by side). The work is quantkit.validate.sampling's. Imports no torch until it runs."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.contract import TaskResult
from quantkit.option import opt
from quantkit.task_registry import THINK_METRICS, Metric, Prepared, Task, register_task

if TYPE_CHECKING:
    from quantkit.results import Results
    from quantkit.validate.runner import Models, PrepareTask, RunTask, TaskContext, TaskSettings

UNFLAGGED_SAMPLE = 4  # unflagged output pairs the report shows to read


@dataclass(frozen=True)
class SamplingOptions:
    samples: int = opt(64, "Sampling check: prompts sampled per model.")
    temperature: float = opt(0.9, "Sampling check temperature.")
    top_p: float = opt(0.9, "Sampling check top_p.")
    max_tokens: int = opt(256, "Sampling check: new tokens per output.")

    def check(self) -> None:
        from quantkit.config.fields import check_range

        check_range("samples", self.samples, 1, 10000)
        check_range("max_tokens", self.max_tokens, 1, 32768)
        check_range("temperature", self.temperature, 0.0, 2.0)
        check_range("top_p", self.top_p, 0.01, 1.0)


def prepare(cfg: Any, name: str) -> Prepared:
    """The prompts: the domain set's questions where the domain task runs, else the built-in."""
    from quantkit.tasks.domain import rows_if_run
    from quantkit.validate.sampling import BUILTIN_PROMPTS

    rows = rows_if_run(cfg)
    return Prepared([r["prompt"] for r in rows or [] if r["kind"] == "qa"] or BUILTIN_PROMPTS)


def settings(cfg: Any, name: str, data: Any) -> dict[str, Any]:
    opts = cfg.options(name)
    return {"sampling": {"n": opts.samples, "temperature": opts.temperature, "top_p": opts.top_p,
                         "max_tokens": opts.max_tokens, "seed": cfg.seed}}


def run_task(models: Models, ctx: TaskContext) -> TaskResult:
    """Both models sample the same prompts (the baseline's side cached); the quantized outputs
    are scored by the original model: how plausible it finds them."""
    from quantkit.validate.runner import cached_baseline
    from quantkit.validate.sampling import sample_check, sample_side

    prompts = ctx.data
    gen = settings(ctx.cfg, ctx.name, prompts)["sampling"]
    served = ctx.thinking
    seeds = ctx.cfg.seeds_for(thinks=served is not None, temperature=gen["temperature"])
    if seeds > 1 or served is not None:  # one seed of a non-thinking model: the key it had
        gen["seeds"] = seeds
    key = [prompts, gen] + ([served.record()] if served is not None else [])
    base = cached_baseline(models, ctx.name, key,
                           lambda e: sample_side(e, prompts, served=served, **gen))
    return sample_check(models.get("quantized"), models.get("baseline"), prompts,
                        baseline_side=base, served=served, **gen)


def report_section(t: TaskResult, r: Results) -> str:
    """The settings, both sides' means and flagged shares, the flagged outputs side by side and
    a seeded sample of unflagged ones to read."""
    from quantkit.report.charts import e, interval, kv, num, pct, table
    from quantkit.report.html import section

    s, q, b = t.extra.get("settings") or {}, t.quantized or {}, t.baseline or {}
    qm, bm = q.get("means") or {}, b.get("means") or {}
    rows = [["flagged share", pct(b.get("flagged_share")), pct(q.get("flagged_share"))],
            ["stopped at EOS", pct(b.get("eos_share")), pct(q.get("eos_share"))]]
    rows += [[e(k), num(bm.get(k)), num(qm.get(k))] for k in sorted(qm.keys() | bm.keys())]
    settings = ", ".join(f"{e(k)} {num(v, 2)}" for k, v in s.items())
    body = (f'<p class="meta">{settings}</p>'
            + table(["metric (mean)", "baseline", "quantized"],
                    [[c[0]] + [f'<td class="num">{x}</td>' for x in c[1:]] for c in rows])
            + kv([("flagged share increase", interval(t.metric("flagged_increase"), pct))]))
    from quantkit.validate.seeds import describe_spread

    per_seed = t.extra.get("seeds") or {}
    for key, what in (("flagged_share", "flagged share"), ("think_closed", "thinking closed")):
        line = describe_spread(per_seed.get(key), what)
        body += f'<p class="meta">{e(line)}</p>' if line else ""
    from quantkit.validate.served import describe

    think = describe(t)
    if think:
        body = f'<p class="meta">{e(think)}</p>' + body
    bo = {o.get("i"): o for o in b.get("outputs") or []}
    qo = {o.get("i"): o for o in q.get("outputs") or []}
    ids = sorted(bo.keys() | qo.keys(), key=lambda i: (str(type(i)), i))
    flagged = [i for i in ids if (bo.get(i) or {}).get("flags") or (qo.get(i) or {}).get("flags")]
    plain = [i for i in ids if i not in flagged and i in bo and i in qo]
    seed = s.get("seed", (r.settings or {}).get("seed", 0))
    sample = sorted(random.Random(seed).sample(plain, min(UNFLAGGED_SAMPLE, len(plain))),
                    key=lambda i: (str(type(i)), i))
    body += f"<h3>Flagged outputs ({len(flagged)}), same prompt and seed side by side</h3>"
    body += _pairs_table(flagged, bo, qo) if flagged else "<p>No output was flagged.</p>"
    if sample:
        body += (f"<h3>A random sample of unflagged outputs ({len(sample)} of {len(plain)}, "
                 f"seed {e(seed)}) to read</h3>" + _pairs_table(sample, bo, qo))
    return section("sampling", "Sampling check", body)


def _output_cell(o: dict[str, Any] | None) -> str:
    from quantkit.report.charts import e, num

    if not o:
        return "<td>—</td>"
    flags = o.get("flags") or []
    badges = "".join(f'<span class="flag">{e(f)}</span>' for f in flags)
    meta = (f'<div class="meta">finish: {e(o.get("finish_reason"))} · baseline NLL '
            f'{num(o.get("baseline_nll"))}</div>')
    cls = ' class="flagged"' if flags else ""
    return f"<td{cls}>{badges}{meta}<pre>{e(o.get('text'))}</pre></td>"


def _pairs_table(ids: list[Any], bo: dict[Any, Any], qo: dict[Any, Any]) -> str:
    from quantkit.report.charts import e, num, table

    rows = [[num(i), f"<pre>{e((qo.get(i) or bo.get(i) or {}).get('prompt'))}</pre>",
             _output_cell(bo.get(i)), _output_cell(qo.get(i))] for i in ids]
    return table(["#", "prompt", "baseline", "quantized"], rows, "pairs")


register_task(Task("sampling", run=run_task, title="Sampling check",
                   headline=None, section=report_section,
                   options=SamplingOptions,
                   prepare=prepare,
                   settings=settings,
                   metrics={"flagged_increase": Metric(
                       "<=", -1.0, 1.0, "flagged share of quantized outputs minus the baseline's"),
                       **THINK_METRICS}))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _run: RunTask = run_task
    _prepare: PrepareTask = prepare
    _settings: TaskSettings = settings
