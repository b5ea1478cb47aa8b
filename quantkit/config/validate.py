"""`quantkit validate`'s options: the recipe's `validate:` section. The tasks are the task
registry's (quantkit.tasks), the engines the engine registry's."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.config.fields import check_range, check_seed, opt
from quantkit.engines.choice import engine_choices
from quantkit.errors import BadInput
from quantkit.tasks import TASKS, check_lm_eval_tasks, default_tasks, task

if TYPE_CHECKING:
    from quantkit.gate import Thresholds


VALIDATE_SANDBOXES = ("auto", "bwrap", "basic")


@dataclass(frozen=True)
class ValidateConfig:
    """`quantkit validate` and the recipe's `validate:` section."""

    tasks: tuple[str, ...] = opt((), "Comma-separated: quantkit's " + ",".join(TASKS.names())
                                     + " (default: all that have data), or any lm-eval task "
                                       "(arc_easy, gsm8k, ...; with --task-path, your own).",
                                     cli="csv")
    task_path: tuple[str, ...] = opt((), "Folder of lm-eval task YAMLs, searched as lm-eval's "
                                         "--include_path is. Repeatable.")
    engine: str = opt("auto", "|".join(engine_choices()) + ": both models run on it; auto is the "
                              "engine `quantkit serve` picks for the artifact on this machine.")
    domain_set: str | None = opt(None, "JSONL: {text} lines (perplexity) or {prompt, answer"
                                       "[, match]} lines.")
    limit: int | None = opt(None, "MMLU questions per subject and HumanEval problems "
                                  "(default: all).")
    humaneval_limit: int | None = opt(None, "HumanEval problems (default: --limit).")
    humaneval_max_tokens: int = opt(384, "HumanEval: new tokens per completion.")
    sandbox: str = opt("auto", "HumanEval: where the model's programs run: bwrap (namespaces: "
                               "read-only system, no network, no home), basic (process limits "
                               "and a guard; weaker, and said so in the results), or auto: "
                               "bwrap where it works, else basic.")
    mmlu_data: str | None = opt(None, "Folder with {test,dev}/SUBJECT.jsonl, or a hub dataset "
                                      "such as cais/mmlu (default: the copy shipped with quantkit).")
    samples: int = opt(64, "Sampling check: prompts sampled per model.")
    temperature: float = opt(0.9, "Sampling check temperature.")
    top_p: float = opt(0.9, "Sampling check top_p.")
    max_tokens: int = opt(256, "Sampling check: new tokens per output.")
    long_context_samples: int = opt(12, "long_context: documents, at a quarter, half and all of "
                                        "the engine's context, facts at 10/50/90% depth.")
    seed: int = opt(0, "Seed for sampling and bootstrap intervals.")
    threads: int = opt(0, "Engine threads, 0 = the engine's default.")
    thresholds: dict[str, Any] = opt({}, "YAML file: task -> limits, e.g. mmlu: {retention: 0.97} "
                                         "(in a recipe: the mapping itself).", cli="thresholds")

    def check(self) -> None:
        """Option values that are wrong whatever the models (the thresholds included)."""
        if self.engine not in engine_choices():
            raise BadInput(f"unknown --engine {self.engine!r}", "use " + ", ".join(engine_choices()))
        if self.sandbox not in VALIDATE_SANDBOXES:
            raise BadInput(f"unknown --sandbox {self.sandbox!r}",
                           "use " + ", ".join(VALIDATE_SANDBOXES))
        for name in self.tasks:
            needs = task(name).needs
            if needs and getattr(self, needs) is None:
                raise BadInput(f"the {name} task needs {task(name).needs_what}",
                               f"pass --{needs.replace('_', '-')} FILE")
        external = [t for t in self.tasks if t not in TASKS]
        if external or self.task_path:  # lm-eval's own registry and the folders given
            check_lm_eval_tasks(external, self.task_path)
        for name, value in (("limit", self.limit), ("humaneval_limit", self.humaneval_limit)):
            if value is not None and value < 1:
                raise BadInput(f"--{name.replace('_', '-')} {value} must be 1 or more",
                               "leave it out to run everything")
        check_range("samples", self.samples, 1, 10000)
        check_range("max_tokens", self.max_tokens, 1, 32768)
        check_range("humaneval_max_tokens", self.humaneval_max_tokens, 1, 32768)
        check_range("temperature", self.temperature, 0.0, 2.0)
        check_range("top_p", self.top_p, 0.01, 1.0)
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 or more", "use --threads 0")
        check_seed(self.seed)
        if self.long_context_samples < 1:
            raise BadInput(f"--long-context-samples {self.long_context_samples} must be at least 1",
                           "use e.g. 12")
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
