"""MMLU, the built-in `--tasks mmlu`: both models' 5-shot accuracy through lm-evaluation-harness
(its own `mmlu_*` tasks and scoring) and its retention over the same questions; its own option
(--mmlu-data), its lifecycle and its report section (per-subject changes). The work is
quantkit.validate.mmlu's. Imports no torch until it runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.contract import TaskResult
from quantkit.errors import BadInput
from quantkit.option import opt
from quantkit.task_registry import Prepared, Task, register_task, retention

if TYPE_CHECKING:
    from quantkit.results import Results
    from quantkit.validate.runner import Models, PrepareTask, RunTask, TaskContext, TaskSettings


@dataclass(frozen=True)
class MMLUOptions:
    """No `check()`: nothing to check without the file system (prepare looks at the folder)."""

    mmlu_data: str | None = opt(None, "Folder with {test,dev}/SUBJECT.jsonl, or a hub dataset "
                                      "such as cais/mmlu (default: the copy shipped with quantkit).")


def prepare(cfg: Any, name: str) -> Prepared:
    """The MMLU data folder or hub id, checked before any model loads (None: the bundled copy)."""
    from quantkit.validate.mmlu import hub_id

    data = cfg.options(name).mmlu_data
    if data is not None and hub_id(data) is None and not Path(data).is_dir():
        raise BadInput(f"MMLU data folder {data} does not exist",
                       "leave --mmlu-data out for the MMLU shipped with quantkit, or pass a "
                       "folder of {test,dev}/SUBJECT.jsonl or a hub id such as cais/mmlu")
    return Prepared(Path(data) if data is not None else None)


def settings(cfg: Any, name: str, data: Any) -> dict[str, Any]:
    return {"mmlu_data": cfg.options(name).mmlu_data}


def run_task(models: Models, ctx: TaskContext) -> TaskResult:
    """Both sides' accuracy (the baseline's cached) and retention over the same questions."""
    from quantkit import console
    from quantkit.validate.lmeval import Encoded
    from quantkit.validate.mmlu import MMLUSide, run_mmlu
    from quantkit.validate.runner import cached_baseline, paired_retention

    cfg, data_dir = ctx.cfg, ctx.data
    encoded: Encoded = {}  # the two sides' shared tokenization (one tokenizer: encoded once)

    def side(engine: Any) -> MMLUSide:
        return run_mmlu(engine, data_dir=data_dir, limit=cfg.limit, progress=console.progress,
                        encoded=encoded)

    base = cached_baseline(models, ctx.name, [cfg.limit, str(ctx.options.mmlu_data)], side)
    quant = side(models.get("quantized"))
    return TaskResult(quant, base, {"retention": paired_retention(quant, base, "correct", cfg.seed)})


def report_section(t: TaskResult, r: Results | None = None) -> str:
    """Both sides' accuracy, the retention and each subject's change, worst first."""
    from quantkit.report.charts import delta_bars, e, interval, kv, num
    from quantkit.report.html import section

    q, b = t.quantized or {}, t.baseline or {}
    qs, bs = q.get("subjects") or {}, b.get("subjects") or {}
    deltas = sorted(((s, qs[s]["accuracy"] - bs[s]["accuracy"]) for s in qs.keys() & bs.keys()
                     if isinstance((qs[s] or {}).get("accuracy"), (int, float))
                     and isinstance((bs[s] or {}).get("accuracy"), (int, float))),
                    key=lambda kv: (kv[1], kv[0]))
    body = kv([("accuracy, baseline", f"{num(b.get('accuracy'))} (n={num(b.get('n'))})"),
               ("accuracy, quantized", f"{num(q.get('accuracy'))} (n={num(q.get('n'))})"),
               ("retention", interval(t.metric("retention")))])
    moved = [(s, d) for s, d in deltas if abs(d) > 1e-9]
    if moved:
        body += (f"<h3>Per subject: quantized − baseline accuracy ({len(moved)} of {len(deltas)} "
                 "subjects changed, worst first)</h3>" + delta_bars(moved))
    if len(moved) < len(deltas):
        same = ", ".join(e(s) for s, d in deltas if abs(d) <= 1e-9)
        body += f'<p class="meta">Unchanged ({len(deltas) - len(moved)}): {same}</p>'
    return section("mmlu", "MMLU", body)


register_task(Task("mmlu", run=run_task, title="MMLU",
                   metrics={"retention": retention("accuracy")},
                   section=report_section,
                   options=MMLUOptions,
                   prepare=prepare, settings=settings))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _run: RunTask = run_task
    _prepare: PrepareTask = prepare
    _settings: TaskSettings = settings
