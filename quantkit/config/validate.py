"""`quantkit validate`'s options: the recipe's `validate:` section. The options every task shares
are declared here; each registered task's own (`Task.options`, e.g. MMLU's --mmlu-data, the
sampling check's --samples) join them as fields of the same dataclass, so they stay one flag and
one recipe key each. The tasks are the task registry's (quantkit.tasks), the engines the engine
registry's."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from quantkit.config.fields import check_seed, opt
from quantkit.config.tasks import VALIDATE_SANDBOXES, at_least_one
from quantkit.engines.choice import engine_choices
from quantkit.errors import BadInput
from quantkit.tasks import TASKS, check_lm_eval_tasks, default_tasks, options_class, task

if TYPE_CHECKING:
    from quantkit.gate import Thresholds

__all__ = ["VALIDATE_SANDBOXES", "ValidateConfig"]
C = TypeVar("C")


def _with_task_options(cls: type[C]) -> type[C]:
    """`cls` with each registered task's own options after its fields (a task registered once
    this module is imported runs on its options' defaults)."""
    from quantkit import console

    added: list[tuple[str, Any, Any]] = []
    taken = {f.name: "validate" for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for name in TASKS.names():
        try:
            opts = options_class(name)
            if opts is None:
                continue
            hints = get_type_hints(opts)
            fields = dataclasses.fields(opts)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break quantkit
            if TASKS.plugin(name) is None:
                raise
            console.err.print(f"warning: task {name}'s options could not be read: "
                              f"{type(exc).__name__}: {exc}", markup=False, soft_wrap=True)
            continue
        for f in fields:
            clash = taken.get(f.name)
            missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if clash is None and not missing:
                taken[f.name] = name
                added.append((f.name, hints[f.name], dataclasses.field(
                    default=f.default, default_factory=f.default_factory, metadata=f.metadata)))
                continue
            why = f"{clash} has an option of that name" if clash else "it has no default"
            if TASKS.plugin(name) is None:
                raise TypeError(f"task {name}: option {f.name} is left out: {why}")
            console.err.print(f"warning: task {name}: option {f.name} is left out: {why}",
                              markup=False, soft_wrap=True)
    made = dataclasses.make_dataclass(cls.__name__, added, bases=(cls,), frozen=True)
    made.__module__, made.__qualname__, made.__doc__ = cls.__module__, cls.__qualname__, cls.__doc__
    return made


@_with_task_options
@dataclass(frozen=True)
class ValidateConfig:
    """`quantkit validate` and the recipe's `validate:` section (each task's own options follow
    these fields: `options(name)` reads them)."""

    tasks: tuple[str, ...] = opt((), "Comma-separated: quantkit's " + ",".join(TASKS.names())
                                     + " (default: all that have data), or any lm-eval task "
                                       "(arc_easy, gsm8k, ...; with --task-path, your own).",
                                     cli="csv")
    task_path: tuple[str, ...] = opt((), "Folder of lm-eval task YAMLs, searched as lm-eval's "
                                         "--include_path is. Repeatable.")
    engine: str = opt("auto", "|".join(engine_choices()) + ": both models run on it; auto is the "
                              "engine `quantkit serve` picks for the artifact on this machine.")
    limit: int | None = opt(None, "MMLU questions per subject and HumanEval problems "
                                  "(default: all).")
    seed: int = opt(0, "Seed for sampling and bootstrap intervals.")
    threads: int = opt(0, "Engine threads, 0 = the engine's default.")
    thresholds: dict[str, Any] = opt({}, "YAML file: task -> limits, e.g. mmlu: {retention: 0.97} "
                                         "(in a recipe: the mapping itself).", cli="thresholds")

    def options(self, name: str) -> Any:
        """Task `name`'s own options as its dataclass, read from this config (None: it has none)."""
        opts = options_class(name)
        if opts is None:
            return None
        return opts(**{f.name: getattr(self, f.name) for f in dataclasses.fields(opts)
                       if hasattr(self, f.name)})

    def check(self) -> None:
        """Option values that are wrong whatever the models (the thresholds included)."""
        if self.engine not in engine_choices():
            raise BadInput(f"unknown --engine {self.engine!r}", "use " + ", ".join(engine_choices()))
        for name in self.tasks:
            needs = task(name).needs
            if needs and getattr(self, needs, None) is None:
                raise BadInput(f"the {name} task needs {task(name).needs_what}",
                               f"pass --{needs.replace('_', '-')} FILE")
        external = [t for t in self.tasks if t not in TASKS]
        if external or self.task_path:  # lm-eval's own registry and the folders given
            check_lm_eval_tasks(external, self.task_path)
        at_least_one("limit", self.limit)
        for name in TASKS.names():  # every task's, run or not: a wrong value is wrong anyway
            opts = self.options(name)
            if opts is not None and hasattr(opts, "check"):
                opts.check()
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 or more", "use --threads 0")
        check_seed(self.seed)
        not_run = sorted(set(self.limits) - set(self.run_tasks))
        if not_run:
            raise BadInput(f"thresholds name {', '.join(not_run)}, which --tasks does not run",
                           "add the task to --tasks or drop its threshold")

    @functools.cached_property
    def limits(self) -> Thresholds:
        """The thresholds, parsed and checked once (empty: an ungated run)."""
        from quantkit.gate import Thresholds

        return Thresholds.parse(self.thresholds) if self.thresholds else Thresholds()

    @property
    def run_tasks(self) -> list[str]:
        """The tasks that run: those asked for, else every task that has data."""
        if self.tasks:
            return list(dict.fromkeys(self.tasks))
        return default_tasks({f.name for f in dataclasses.fields(self)
                              if getattr(self, f.name) not in (None, (), {})})
