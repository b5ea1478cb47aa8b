"""The report's task sections: each task's own, named by the task registry (`Task.section`: a
built-in task's is in its module of quantkit.tasks), and a generic one for tasks that name none
(lm-eval tasks, long_context, a task registered without a section)."""

from __future__ import annotations

from quantkit.contract import TaskResult
from quantkit.report.charts import e, interval, kv, num, table
from quantkit.report.html import section
from quantkit.results import Results
from quantkit.task_registry import task as task_spec


def task_section(name: str, t: TaskResult, results: Results) -> str:
    """The report section of task `name`'s result `t`."""
    if not t.to_dict():
        return ""
    own = task_spec(name).render(t, results)
    return generic(t, results, name) if own is None else own


def generic(t: TaskResult, results: Results, name: str = "") -> str:
    """Each side's main score (an lm-eval task's) and every gated metric of the task, with intervals."""
    spec = task_spec(name)
    q = t.quantized if isinstance(t.quantized, dict) else {}
    b = t.baseline if isinstance(t.baseline, dict) else {}
    facts = []
    if isinstance(b.get("value"), (int, float)) or isinstance(q.get("value"), (int, float)):
        metric = t.extra.get("metric") or "score"
        facts += [(f"{e(metric)}, {side}", f"{interval(t.metric(side + '_score'))} "
                   f"(n={num(s.get('n'))})") for side, s in (("baseline", b), ("quantized", q))]
    facts += [(e(k), interval(t.metric(k))) for k in spec.metrics if t.metric(k) is not None]
    body = kv(facts)
    subtasks = q.get("subtasks") or {}
    if len(subtasks) > 1:
        bs = b.get("subtasks") or {}
        body += "<h3>Per subtask</h3>" + table(
            ["subtask", "metric", "baseline", "quantized", "n"],
            [[f"<code>{e(k)}</code>", e(v.get("metric")), num((bs.get(k) or {}).get("value")),
              num(v.get("value")), num(v.get("n"))] for k, v in subtasks.items()])
    if t.extra.get("source") == "lm-eval":
        body += ('<p class="meta">Scored through lm-evaluation-harness: the task\'s own template, '
                 "few-shot setting and metric, on the engine that serves the artifact.</p>")
    return section(name, spec.title, body)
