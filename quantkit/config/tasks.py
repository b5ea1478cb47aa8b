"""The built-in validation tasks' own options: one frozen dataclass per task, named by its entry in
the task registry (quantkit.tasks, `Task.options`). Their fields join `ValidateConfig` (the
recipe's `validate:` section, one flag each, as the shared options are); each task reads its
own as `cfg.options(name)`. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.config.fields import check_range, opt
from quantkit.errors import BadInput

VALIDATE_SANDBOXES = ("auto", "bwrap", "basic")


def at_least_one(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise BadInput(f"--{name.replace('_', '-')} {value} must be 1 or more",
                       "leave it out to run everything")


@dataclass(frozen=True)
class MMLUOptions:
    mmlu_data: str | None = opt(None, "Folder with {test,dev}/SUBJECT.jsonl, or a hub dataset "
                                      "such as cais/mmlu (default: the copy shipped with quantkit).")

    def check(self) -> None:
        """Nothing to check without the file system (prepare looks at the folder)."""


@dataclass(frozen=True)
class HumanEvalOptions:
    humaneval_limit: int | None = opt(None, "HumanEval problems (default: --limit).")
    humaneval_max_tokens: int = opt(384, "HumanEval: new tokens per completion.")
    sandbox: str = opt("auto", "HumanEval: where the model's programs run: bwrap (namespaces: "
                               "read-only system, no network, no home), basic (process limits "
                               "and a guard; weaker, and said so in the results), or auto: "
                               "bwrap where it works, else basic.")

    def check(self) -> None:
        if self.sandbox not in VALIDATE_SANDBOXES:
            raise BadInput(f"unknown --sandbox {self.sandbox!r}",
                           "use " + ", ".join(VALIDATE_SANDBOXES))
        at_least_one("humaneval_limit", self.humaneval_limit)
        check_range("humaneval_max_tokens", self.humaneval_max_tokens, 1, 32768)


@dataclass(frozen=True)
class DomainOptions:
    domain_set: str | None = opt(None, "JSONL: {text} lines (perplexity) or {prompt, answer"
                                       "[, match]} lines.")

    def check(self) -> None:
        """Nothing to check without the file system (prepare reads the file)."""


@dataclass(frozen=True)
class SamplingOptions:
    samples: int = opt(64, "Sampling check: prompts sampled per model.")
    temperature: float = opt(0.9, "Sampling check temperature.")
    top_p: float = opt(0.9, "Sampling check top_p.")
    max_tokens: int = opt(256, "Sampling check: new tokens per output.")

    def check(self) -> None:
        check_range("samples", self.samples, 1, 10000)
        check_range("max_tokens", self.max_tokens, 1, 32768)
        check_range("temperature", self.temperature, 0.0, 2.0)
        check_range("top_p", self.top_p, 0.01, 1.0)


@dataclass(frozen=True)
class LongContextOptions:
    long_context_samples: int = opt(12, "long_context: documents, at a quarter, half and all of "
                                        "the engine's context, facts at 10/50/90% depth.")

    def check(self) -> None:
        if self.long_context_samples < 1:
            raise BadInput(f"--long-context-samples {self.long_context_samples} must be at least 1",
                           "use e.g. 12")
