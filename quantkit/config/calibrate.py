"""`quantkit calibrate`'s options: the recipe's `calibration:` section."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.config.fields import check_seed, opt
from quantkit.errors import BadInput


@dataclass(frozen=True)
class CalibrateConfig:
    """`quantkit calibrate` and the recipe's `calibration:` section."""

    sources: tuple[str, ...] = opt((), "FILE|FOLDER|hf:NAME[:CONFIG][:SPLIT]|builtin:stdlib-docs|"
                                       "builtin:stdlib-code, optionally @WEIGHT. Repeatable.",
                                   flag="--source")
    samples: int = opt(256, "Number of samples (128-512 advised).")
    min_tokens: int = opt(512, "Shortest sample; short documents are packed.")
    max_tokens: int = opt(2048, "Longest sample; longer documents are cut.")
    seed: int = opt(0, "Seed for a reproducible set.")
    exclude: tuple[str, ...] = opt((), "Evaluation set whose 13-grams must not appear. Repeatable.")
    target: str | None = opt(None, "Domain test set to measure the match against.")
    self_traces: int = opt(0, "The original model answers this many of the sources' chat "
                              "prompts, thinking on where it thinks; its answers join the set.")
    trace_temperature: float = opt(0.0, "Self-traces: sampling temperature (0: greedy).")
    trace_top_p: float = opt(0.95, "Self-traces: top_p where the temperature is above 0.")
    trace_max_tokens: int = opt(1024, "Self-traces: new tokens per answer, thinking included.")

    def check(self) -> None:
        """Option values that are wrong whatever the model (no files read)."""
        if not self.sources:
            raise BadInput("no --source given",
                           "add --source FILE|FOLDER|hf:NAME|builtin:stdlib-docs")
        if self.samples < 1:
            raise BadInput(f"--samples {self.samples} must be at least 1", "use 128-512")
        if self.min_tokens < 1 or self.max_tokens < 1:
            raise BadInput("--min-tokens and --max-tokens must be positive", "use 512 and 2048")
        if self.min_tokens > self.max_tokens:
            raise BadInput(f"--min-tokens {self.min_tokens} is larger than --max-tokens "
                           f"{self.max_tokens}", "make --min-tokens <= --max-tokens")
        check_seed(self.seed)
        from quantkit.config.fields import check_range

        check_range("self_traces", self.self_traces, 0, 100000)
        check_range("trace_temperature", self.trace_temperature, 0.0, 2.0)
        check_range("trace_top_p", self.trace_top_p, 0.01, 1.0)
        check_range("trace_max_tokens", self.trace_max_tokens, 1, 131072)
