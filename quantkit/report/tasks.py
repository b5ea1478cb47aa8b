"""The report's task sections: each task's own, named by the task registry (`Task.section`: a
built-in task's is in its module of quantkit.tasks), and a generic one for tasks that name none
(lm-eval tasks, long_context, a task registered without a section)."""

from __future__ import annotations

from typing import Any

from quantkit.registry import load
from quantkit.report.charts import e, interval, kv, num, table
from quantkit.report.html import section
from quantkit.task_registry import task as task_spec


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
