"""`quantkit auto`'s options: the recipe's `auto:` section; candidates in each method's grammar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.config.fields import opt
from quantkit.methods import METHODS


@dataclass(frozen=True)
class AutoConfig:
    """`quantkit auto` and the recipe's `auto:` section."""

    method: str = opt("gptq", ", ".join(METHODS) + ": which family of candidates to try.")
    candidates: tuple[str, ...] = opt((), "Candidates, smallest first (default: the method's "
                                          "ladder, " + "; ".join(
                                              f"{m}: {','.join(METHODS[m].ladder)}"
                                              for m in METHODS) + "; W4g32+10%: the 10% most "
                                          "sensitive linear groups at 8 bits).", cli="csv")
    early_reject: bool = opt(True, "Reject a candidate on the domain task's limits (KL, top-1, "
                                   "perplexity) before running the other tasks.")
    shared_hessians: bool = opt(False, "GPTQ candidates: Hessians from one pass of the original "
                                       "model, shared by all (--hessians original: each "
                                       "candidate costs its sweeps, at some quality: no error "
                                       "propagation); off: each quantized sequentially.")

    @property
    def ladder(self) -> tuple[str, ...]:
        method = METHODS.get(self.method)
        return self.candidates or (method.ladder if method else ())

    def check(self) -> None:
        METHODS[self.method]  # an unknown method is BadInput with the closest name
        for name in self.ladder:
            parse_candidate(self.method, name)


def parse_candidate(method: str, name: str) -> dict[str, Any]:
    """A candidate's quantize settings from its name, in the method's own grammar."""
    return METHODS[method].parse(name)
