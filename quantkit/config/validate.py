"""`quantkit validate`'s options: the recipe's `validate:` section. The options every task shares
are declared here; each registered task's own (`Task.options`, e.g. MMLU's --mmlu-data, the
sampling check's --samples) join them as fields of the same dataclass, so they stay one flag and
one recipe key each. The tasks are the task registry's (quantkit.task_registry), the engines the
engine registry's."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.config.fields import at_least_one, check_seed, opt
from quantkit.config.options import each, read, with_options
from quantkit.engines.choice import engine_choices
from quantkit.errors import BadInput
from quantkit.task_registry import TASKS, check_lm_eval_tasks, default_tasks, options_class, task

if TYPE_CHECKING:
    from quantkit.gate import Thresholds

__all__ = ["ValidateConfig"]


@with_options(TASKS, "validate")
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
    thinking: str = opt("auto", "auto|on|off: the thinking mode a thinking model is validated in, "
                                "as it will be served (auto: its chat template's default). "
                                "HumanEval, the domain QA and the sampling check score what "
                                "follows the thinking.")
    thinking_budget: int | None = opt(None, "Thinking tokens a thinking model may spend before "
                                            "its answer (default: 2048, or its context where "
                                            "shorter).")
    seeds: int | str = opt("auto", "Seeds per sampled item (tasks sampling above temperature 0, "
                                   "e.g. the sampling check): scores and intervals paired over "
                                   "items and seeds. auto: 3 for a model with a thinking mode, "
                                   "else 1.")
    thresholds: dict[str, Any] = opt({}, "YAML file: task -> limits, e.g. mmlu: {retention: 0.97} "
                                         "(in a recipe: the mapping itself).", cli="thresholds")

    def __post_init__(self) -> None:
        # --seeds arrives from the command line as text: "3" is the recipe's 3
        if isinstance(self.seeds, str) and self.seeds.strip().isdigit():
            object.__setattr__(self, "seeds", int(self.seeds))

    def options(self, name: str) -> Any:
        """Task `name`'s own options as its dataclass, read from this config (None: it has none)."""
        opts = options_class(name)
        return None if opts is None else read(opts, self)

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
        for opts in each(TASKS):  # every task's, run or not: a wrong value is wrong anyway
            own = read(opts, self)
            if hasattr(own, "check"):
                own.check()
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 or more", "use --threads 0")
        check_seed(self.seed)
        from quantkit.thinking import MODES

        if self.thinking not in MODES:
            raise BadInput(f"unknown --thinking {self.thinking!r}", "use " + ", ".join(MODES))
        if self.thinking_budget is not None and self.thinking_budget < 1:
            raise BadInput(f"--thinking-budget {self.thinking_budget} must be 1 or more",
                           "give the thinking tokens allowed before the answer, e.g. 1024; or "
                           "leave it out for 2048")
        self.seeds_for(thinks=False, temperature=0.0)  # "auto" or a count from 1: else BadInput
        not_run = sorted(set(self.limits) - set(self.run_tasks))
        if not_run:
            raise BadInput(f"thresholds name {', '.join(not_run)}, which --tasks does not run",
                           "add the task to --tasks or drop its threshold")

    def seeds_for(self, *, thinks: bool, temperature: float) -> int:
        """The seeds a task sampling at `temperature` runs each item with: --seeds, or for auto 3
        where the model thinks and samples above temperature 0 (its scores move across seeds),
        else 1 (one seed, as before seeds were an option)."""
        value = str(self.seeds).strip()
        if value == "auto":
            return 3 if thinks and temperature > 0 else 1
        if not value.isdigit() or int(value) < 1 or int(value) > 1000:
            raise BadInput(f"--seeds {self.seeds} must be auto or a count from 1 to 1000",
                           "use --seeds auto (3 for a thinking model sampled above temperature "
                           "0, else 1) or e.g. --seeds 3")
        return int(value)

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
