"""The report's task sections: one per task, named by the task registry (quantkit.tasks), and a
generic one for tasks that name none (lm-eval tasks, a task registered without a section)."""

from __future__ import annotations

import random
from typing import Any

from quantkit.registry import load
from quantkit.report.charts import delta_bars, e, interval, kv, num, pct, table
from quantkit.report.html import section
from quantkit.tasks import task as task_spec

UNFLAGGED_SAMPLE = 4


def task_section(name: str, t: Any, results: dict[str, Any]) -> str:
    """The report section of task `name`'s result `t`."""
    if not isinstance(t, dict) or not t:
        return ""
    spec = task_spec(name)
    render = load(spec.section) if spec.section else generic
    return str(render(t, results) if spec.section else generic(t, results, name))


def generic(t: dict[str, Any], results: dict[str, Any], name: str = "") -> str:
    """Each side's main score (an lm-eval task's) and every gated metric of the task, with intervals."""
    spec = task_spec(name)
    q, b = t.get("quantized") or {}, t.get("baseline") or {}
    facts = []
    if isinstance(b.get("value"), (int, float)) or isinstance(q.get("value"), (int, float)):
        metric = t.get("metric") or "score"
        facts += [(f"{e(metric)}, baseline", f"{interval(t.get('baseline_score'))} (n={num(b.get('n'))})"),
                  (f"{e(metric)}, quantized", f"{interval(t.get('quantized_score'))} (n={num(q.get('n'))})")]
    facts += [(e(k), interval(t.get(k))) for k in spec.metrics if isinstance(t.get(k), dict)]
    body = kv(facts)
    subtasks = q.get("subtasks") or {}
    if len(subtasks) > 1:
        bs = b.get("subtasks") or {}
        body += "<h3>Per subtask</h3>" + table(
            ["subtask", "metric", "baseline", "quantized", "n"],
            [[f"<code>{e(k)}</code>", e(v.get("metric")), num((bs.get(k) or {}).get("value")),
              num(v.get("value")), num(v.get("n"))] for k, v in subtasks.items()])
    if t.get("source") == "lm-eval":
        body += ('<p class="meta">Scored through lm-evaluation-harness: the task\'s own template, '
                 "few-shot setting and metric, on the engine that serves the artifact.</p>")
    return section(name, spec.title, body)


def mmlu(t: dict[str, Any] | None, r: dict[str, Any] | None = None) -> str:
    if not t:
        return ""
    q, b = t.get("quantized") or {}, t.get("baseline") or {}
    qs, bs = q.get("subjects") or {}, b.get("subjects") or {}
    deltas = sorted(((s, qs[s]["accuracy"] - bs[s]["accuracy"]) for s in qs.keys() & bs.keys()
                     if isinstance((qs[s] or {}).get("accuracy"), (int, float))
                     and isinstance((bs[s] or {}).get("accuracy"), (int, float))),
                    key=lambda kv: (kv[1], kv[0]))
    body = kv([("accuracy, baseline", f"{num(b.get('accuracy'))} (n={num(b.get('n'))})"),
               ("accuracy, quantized", f"{num(q.get('accuracy'))} (n={num(q.get('n'))})"),
               ("retention", interval(t.get("retention")))])
    moved = [(s, d) for s, d in deltas if abs(d) > 1e-9]
    if moved:
        body += (f"<h3>Per subject: quantized − baseline accuracy ({len(moved)} of {len(deltas)} "
                 "subjects changed, worst first)</h3>" + delta_bars(moved))
    if len(moved) < len(deltas):
        same = ", ".join(e(s) for s, d in deltas if abs(d) <= 1e-9)
        body += f'<p class="meta">Unchanged ({len(deltas) - len(moved)}): {same}</p>'
    return section("mmlu", "MMLU", body)


def humaneval(t: dict[str, Any] | None, r: dict[str, Any] | None = None) -> str:
    if not t:
        return ""
    q, b = t.get("quantized") or {}, t.get("baseline") or {}
    qp, bp = q.get("problems") or {}, b.get("problems") or {}
    changed = t.get("changed")
    if changed is None:
        changed = [{"task_id": k, "baseline": bp[k].get("passed"), "quantized": qp[k].get("passed")}
                   for k in sorted(qp.keys() & bp.keys())
                   if bp[k].get("passed") != qp[k].get("passed")]
    facts = [("pass@1, baseline", f"{num(b.get('pass_at_1'))} (n={num(b.get('n'))})"),
             ("pass@1, quantized", f"{num(q.get('pass_at_1'))} (n={num(q.get('n'))})"),
             ("retention", interval(t.get("retention")))]
    sandbox = t.get("sandbox") or q.get("sandbox")
    body = kv(facts + ([("sandbox", e(sandbox))] if sandbox else []))
    if t.get("sandbox_warning"):
        body += f'<p class="note"><b>Weaker sandbox.</b> {e(t["sandbox_warning"])}</p>'
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


def sig(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else num(value)


def domain(t: dict[str, Any] | None, r: dict[str, Any] | None = None) -> str:
    if not t:
        return ""
    q, b = t.get("quantized") or {}, t.get("baseline") or {}
    qa, ba = q.get("qa") or {}, b.get("qa") or {}
    rows = [["perplexity", num(b.get("ppl")), num(q.get("ppl"))],
            ["text lines", num(b.get("text_lines")), num(q.get("text_lines"))]]
    if qa or ba:
        rows += [["QA accuracy", num(ba.get("accuracy")), num(qa.get("accuracy"))],
                 ["QA questions", num(ba.get("n")), num(qa.get("n"))],
                 ["QA mean NLL", num(ba.get("mean_nll")), num(qa.get("mean_nll"))]]
    body = (f"<p>File <code>{e(t.get('file'))}</code></p>"
            + table(["", "baseline", "quantized"], [[r[0]] + [f'<td class="num">{c}</td>'
                                                              for c in r[1:]] for r in rows])
            + kv([("perplexity increase", interval(t.get("ppl_increase"), pct)),
                  ("QA retention", interval(t.get("qa_retention"))),
                  ("KL(original ‖ quantized), mean per token", interval(t.get("kld"), sig)),
                  ("KL, 99th percentile", interval(t.get("kld_p99"), sig)),
                  ("top-1 agreement", interval(t.get("top1_agreement"), pct))]))
    if t.get("kld"):
        tail = (t.get("tail_mass") or {}).get("mean")
        body += (f"<p>KL over {num(t.get('kld_positions'))} token positions: the original's "
                 "256 most likely tokens per position plus one bucket for the rest (a lower bound "
                 f"of the full-vocabulary KL; the rest held {num(tail)} of its mass on average)."
                 "</p>")
    return section("domain", "Domain", body)


def _output_cell(o: dict[str, Any] | None) -> str:
    if not o:
        return "<td>—</td>"
    flags = o.get("flags") or []
    badges = "".join(f'<span class="flag">{e(f)}</span>' for f in flags)
    meta = (f'<div class="meta">finish: {e(o.get("finish_reason"))} · baseline NLL '
            f'{num(o.get("baseline_nll"))}</div>')
    cls = ' class="flagged"' if flags else ""
    return f"<td{cls}>{badges}{meta}<pre>{e(o.get('text'))}</pre></td>"


def _pairs_table(ids: list[Any], bo: dict[Any, Any], qo: dict[Any, Any]) -> str:
    rows = [[num(i), f"<pre>{e((qo.get(i) or bo.get(i) or {}).get('prompt'))}</pre>",
             _output_cell(bo.get(i)), _output_cell(qo.get(i))] for i in ids]
    return table(["#", "prompt", "baseline", "quantized"], rows, "pairs")


def sampling(t: dict[str, Any] | None, r: dict[str, Any]) -> str:
    if not t:
        return ""
    s, q, b = t.get("settings") or {}, t.get("quantized") or {}, t.get("baseline") or {}
    qm, bm = q.get("means") or {}, b.get("means") or {}
    rows = [["flagged share", pct(b.get("flagged_share")), pct(q.get("flagged_share"))],
            ["stopped at EOS", pct(b.get("eos_share")), pct(q.get("eos_share"))]]
    rows += [[e(k), num(bm.get(k)), num(qm.get(k))] for k in sorted(qm.keys() | bm.keys())]
    settings = ", ".join(f"{e(k)} {num(v, 2)}" for k, v in s.items())
    body = (f'<p class="meta">{settings}</p>'
            + table(["metric (mean)", "baseline", "quantized"],
                    [[c[0]] + [f'<td class="num">{x}</td>' for x in c[1:]] for c in rows])
            + kv([("flagged share increase", interval(t.get("flagged_increase"), pct))]))
    bo = {o.get("i"): o for o in b.get("outputs") or []}
    qo = {o.get("i"): o for o in q.get("outputs") or []}
    ids = sorted(bo.keys() | qo.keys(), key=lambda i: (str(type(i)), i))
    flagged = [i for i in ids if (bo.get(i) or {}).get("flags") or (qo.get(i) or {}).get("flags")]
    plain = [i for i in ids if i not in flagged and i in bo and i in qo]
    seed = s.get("seed", (r.get("settings") or {}).get("seed", 0))
    sample = sorted(random.Random(seed).sample(plain, min(UNFLAGGED_SAMPLE, len(plain))),
                    key=lambda i: (str(type(i)), i))
    body += f"<h3>Flagged outputs ({len(flagged)}), same prompt and seed side by side</h3>"
    body += _pairs_table(flagged, bo, qo) if flagged else "<p>No output was flagged.</p>"
    if sample:
        body += (f"<h3>A random sample of unflagged outputs ({len(sample)} of {len(plain)}, "
                 f"seed {e(seed)}) to read</h3>" + _pairs_table(sample, bo, qo))
    return section("sampling", "Sampling check", body)
