"""The validation tasks, in one registry. Every list that names tasks is read from here: the CLI's
`--tasks` help, the recipe's checks, the gate's metrics, the report's sections and the summary.

A task is one module with a `run(models, ctx)` function and one `register_task` line; it carries
its own lifecycle: its options (a dataclass whose fields join `quantkit validate`'s flags and the
recipe's `validate:` section), `prepare` (its data read and checked before any model loads),
`settings` (what results.json records of them), its report section and whether `quantkit auto`
runs it first (`early`). The built-in tasks are the modules of the package quantkit.tasks (which
hands this registry's names on to plugins); the registry names them, as it names every task's
code, and imports them as it is made. Any name that is not registered is an lm-eval task (its
registry, or a `--task-path` folder), scored through quantkit's lm-eval adapter and gated on
`retention`. Pure: imports no torch; what a task runs is named "module:function" and imported
when used (validate/runner.py loads and calls it).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from quantkit.contract import TaskResult
from quantkit.errors import BadInput
from quantkit.registry import Registry, load

if TYPE_CHECKING:  # the types a task's report section takes (nothing of them is imported to run)
    from quantkit.results import Results

__all__ = ["TASKS", "THINK_METRICS", "Metric", "Prepared", "Task", "TaskSection",
           "check_lm_eval_tasks", "default_tasks", "lm_eval_manager", "metrics", "options_class",
           "register_task", "retention", "task"]


@dataclass(frozen=True)
class Metric:
    """A gated metric: how its limit compares, the range a limit may take, what it means."""

    op: str  # ">=" or "<="
    lo: float
    hi: float
    meaning: str


def retention(what: str = "score") -> Metric:
    return Metric(">=", 0.0, 1.5, f"quantized {what} / baseline {what}")


# What a thinking model's generative tasks (HumanEval, the domain QA, the sampling check) also
# gate: measured where the model thinks (validate/served.py), absent otherwise
THINK_METRICS = {
    "think_closed_drop": Metric("<=", -1.0, 1.0, "share of answers whose thinking ended within "
                                                 "the budget, baseline minus quantized"),
    "think_tokens_increase": Metric("<=", -1.0, 10.0, "mean thinking tokens, quantized / "
                                                      "baseline - 1")}


@dataclass(frozen=True)
class Prepared:
    """What a task's `prepare` returns: the data its run gets (`ctx.data`), and a warning said
    before any model loads."""

    data: Any = None
    warning: str | None = None


class TaskSection(Protocol):
    """A task's report section: its result and the whole validation -> HTML."""

    def __call__(self, t: TaskResult, r: Results, /) -> str: ...


@dataclass(frozen=True)
class Task:
    """One validation task.

    `run` names "module:function" (or is the function) taking (models, ctx) and returning the
    task's result dict (both sides and the comparison metrics); `section` likewise renders its
    report section from (task result, results), or None for the generic section; `needs` is the
    ValidateConfig field without which the task is not run by default (and is bad input if
    asked for); `headline` is the metric the report's retention chart shows.

    The lifecycle, each "module:attribute" or the object itself: `options` is a frozen
    dataclass of the task's own settings (fields made with `quantkit.option.opt`, and a
    `check()` where a value can be wrong without the file system); `prepare` takes (the
    ValidateConfig, the task's name) and returns a `Prepared` (its data, read and checked before
    any model loads; BadInput when it is wrong); `settings` takes (cfg, its name, the prepared
    data or None where the task does not run) and returns what results.json's `settings`
    records of it; `early`: `quantkit auto` runs it first and rejects a candidate on its limits
    alone; `warnings`: keys of its result the summary prints.

    `run`, `prepare` and `settings` take validation's types (its models and context, the
    ValidateConfig), which stand above this registry: their Protocols (`RunTask`, `PrepareTask`,
    `TaskSettings`) are quantkit.validate.runner's, which calls them, and each built-in task
    module holds its functions against them (`_run: RunTask = run_task` under TYPE_CHECKING), so
    mypy checks each; `section` is a `TaskSection`, checked where it is passed.
    """

    name: str
    run: str | Callable[..., Any]
    metrics: dict[str, Metric]
    title: str
    section: str | TaskSection | None = None
    needs: str | None = None
    needs_what: str = ""  # what `needs` holds, for the error: "a domain test set"
    headline: str | None = "retention"
    default: bool = True
    external: bool = False  # an lm-eval task, found in its registry rather than here
    summary: tuple[str, ...] = field(default=())  # metric keys the CLI summary prints
    options: str | type | None = None
    prepare: str | Callable[..., Any] | None = None
    settings: str | Callable[..., Any] | None = None
    early: bool = False
    warnings: tuple[str, ...] = ()
    target: str | None = None  # the option naming domain text the calibration set is matched to

    @property
    def summary_keys(self) -> tuple[str, ...]:
        return self.summary or tuple(self.metrics)

    def render(self, t: TaskResult, r: Results) -> str | None:
        """Its report section (its `section`, imported now), or None where it has none."""
        if self.section is None:
            return None
        section: TaskSection = load(self.section)
        return section(t, r)


TASKS: Registry[Task] = Registry("task", "--tasks", "quantkit.tasks")


def register_task(task: Task) -> Task:
    """Add a task; from then on the CLI, recipes, the gate and the report know it."""
    return TASKS.register(task.name, task)


def task(name: str) -> Task:
    """The registered task `name`, or else lm-eval's task of that name (checked when run)."""
    return TASKS.get(name) or Task(name, run="quantkit.validate.lmeval:run_task",
                                   metrics={"retention": retention()}, title=name,
                                   prepare="quantkit.validate.lmeval:prepare",
                                   default=False, external=True)


def options_class(name: str) -> type | None:
    """Task `name`'s options dataclass (imported now), or None where it has none."""
    ref = task(name).options
    return None if ref is None else load(ref)


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


# The built-in tasks, one module each, which registers itself with one `register_task` line: named,
# as every task's code is (they import this registry, and quantkit.validate's and the report's
# code where they run), and imported now, in this order (the CLI's, the recipe's, the report's,
# the catalog's), so that the registry is complete whenever it is asked
BUILT_IN = ("quantkit.tasks.mmlu", "quantkit.tasks.humaneval", "quantkit.tasks.domain",
            "quantkit.tasks.sampling", "quantkit.tasks.long_context")
for _module in BUILT_IN:
    importlib.import_module(_module)
