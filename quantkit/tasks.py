"""The validation tasks, in one registry. Every list that names tasks is read from here: the CLI's
`--tasks` help, the recipe's checks, the gate's metrics, the report's sections and the summary.

A task is one module with a `run(models, ctx)` function plus one `register_task` line below. Any
name that is not registered here is an lm-eval task (its registry, or a `--task-path` folder),
scored through quantkit's lm-eval adapter and gated on `retention`. Pure: imports no torch.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.errors import BadInput
from quantkit.registry import Registry


@dataclass(frozen=True)
class Metric:
    """A gated metric: how its limit compares, the range a limit may take, what it means."""

    op: str  # ">=" or "<="
    lo: float
    hi: float
    meaning: str


def retention(what: str = "score") -> Metric:
    return Metric(">=", 0.0, 1.5, f"quantized {what} / baseline {what}")


@dataclass(frozen=True)
class Task:
    """One validation task.

    `run` names "module:function" (or is the function) taking (models, ctx) and returning the
    task's result dict (both sides and the comparison metrics); `section` likewise renders its
    report section from (task result, results), or None for the generic section; `needs` is the
    ValidateConfig field without which the task is not run by default (and is bad input if
    asked for); `headline` is the metric the report's retention chart shows.
    """

    name: str
    run: str | Callable[..., dict[str, Any]]
    metrics: dict[str, Metric]
    title: str
    section: str | Callable[..., str] | None = None
    needs: str | None = None
    needs_what: str = ""  # what `needs` holds, for the error: "a domain test set"
    headline: str | None = "retention"
    default: bool = True
    external: bool = False  # an lm-eval task, found in its registry rather than here
    summary: tuple[str, ...] = field(default=())  # metric keys the CLI summary prints

    @property
    def summary_keys(self) -> tuple[str, ...]:
        return self.summary or tuple(self.metrics)


TASKS: Registry[Task] = Registry("task", "--tasks", "quantkit.tasks")


def register_task(task: Task) -> Task:
    """Add a task; from then on the CLI, recipes, the gate and the report know it."""
    return TASKS.register(task.name, task)


def task(name: str) -> Task:
    """The registered task `name`, or else lm-eval's task of that name (checked when run)."""
    return TASKS.get(name) or Task(name, run="quantkit.validate.runner:lm_eval_task",
                                   metrics={"retention": retention()}, title=name,
                                   default=False, external=True)


def _yaml_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("**/*.yaml") if "__pycache__" not in p.parts)


@functools.cache
def lm_eval_manager(task_paths: tuple[str, ...]) -> Any:
    """lm-eval's TaskManager over its own tasks and the folders given (indexed once a process)."""
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its per-task notes are not ours to print
    return TaskManager(include_path=[str(p) for p in task_paths] or None)


def check_lm_eval_tasks(names: list[str] | tuple[str, ...], task_paths: tuple[str, ...]) -> None:
    """Every `--task-path` folder holds task YAMLs that lm-eval reads, and every name is a task,
    group or tag lm-eval knows; else BadInput naming it. Loads no data."""
    for folder in map(Path, task_paths):
        if not folder.is_dir():
            raise BadInput(f"--task-path {folder} is not a folder",
                           "pass a folder of lm-eval task YAMLs")
        files = _yaml_files(folder)
        if not files:
            raise BadInput(f"--task-path {folder} holds no task YAML (*.yaml)",
                           "put lm-eval task YAMLs there (task:, dataset_path:, doc_to_text: ...)")
        for f in files:
            _check_yaml(f)
    if not names:
        return
    manager = lm_eval_manager(tuple(task_paths))
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, [*TASKS.names(), *known], n=1)
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise BadInput(f"unknown task {name!r}{guess}: neither quantkit's nor lm-eval's",
                           f"use {', '.join(TASKS.names())}, an lm-eval task such as arc_easy, "
                           "or add its YAML folder with --task-path DIR")


def _check_yaml(path: Path) -> None:
    """One task YAML as lm-eval's index reads it (its `!function` tags unresolved)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        cfg = load_yaml(path, resolve_func=False, recursive=True)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
        raise BadInput(f"task YAML {path} is rejected by lm-eval: {' '.join(str(exc).split())}",
                       "fix the YAML (see lm-eval's docs/task_guide.md)") from exc
    if not isinstance(cfg, dict) or not ({"task", "group", "class"} & set(cfg)):
        raise BadInput(f"task YAML {path} names no `task:` (or `group:`)",
                       "give it `task: NAME`, as lm-eval's task guide shows")


def metrics(name: str) -> dict[str, Metric]:
    """The gated metrics of task `name` (an lm-eval task's: retention)."""
    return task(name).metrics


def default_tasks(have: set[str]) -> list[str]:
    """The tasks run when none are named: every default task whose `needs` is in `have`."""
    return [t.name for t in (TASKS[n] for n in TASKS.names())
            if t.default and (t.needs is None or t.needs in have)]


register_task(Task("mmlu", run="quantkit.validate.runner:mmlu_task", title="MMLU",
                   metrics={"retention": retention("accuracy")},
                   section="quantkit.report.tasks:mmlu"))
register_task(Task("humaneval", run="quantkit.validate.runner:humaneval_task", title="HumanEval",
                   metrics={"retention": retention("pass@1")},
                   section="quantkit.report.tasks:humaneval"))
register_task(Task(
    "domain", run="quantkit.validate.runner:domain_task", title="Domain", needs="domain_set",
    needs_what="a domain test set",
    headline="qa_retention", section="quantkit.report.tasks:domain",
    metrics={"ppl_increase": Metric("<=", 0.0, 10.0, "quantized ppl / baseline ppl - 1"),
             "qa_retention": retention("QA accuracy"),
             "kld": Metric("<=", 0.0, 10.0, "mean per-token KL(original || quantized), nats"),
             "kld_p99": Metric("<=", 0.0, 50.0, "99th percentile of the per-token KL, nats"),
             "top1_agreement": Metric(">=", 0.0, 1.0, "share of tokens where both models rank "
                                                      "the same token first")},
    summary=("ppl_increase", "qa_retention", "kld", "top1_agreement")))
register_task(Task("sampling", run="quantkit.validate.runner:sampling_task", title="Sampling check",
                   headline=None, section="quantkit.report.tasks:sampling",
                   metrics={"flagged_increase": Metric(
                       "<=", -1.0, 1.0, "flagged share of quantized outputs minus the baseline's")}))
register_task(Task("long_context", run="quantkit.validate.runner:long_context_task",
                   title="Long-context retrieval", default=False,
                   metrics={"retention": retention("probability of the planted fact"),
                            "accuracy_retention": retention("greedy retrieval accuracy")},
                   summary=("retention", "accuracy_retention")))
