"""`quantkit auto`'s options: the recipe's `auto:` section; candidates in each method's grammar."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.config.fields import opt, parse_levels
from quantkit.errors import BadInput
from quantkit.method_registry import METHODS, CandidateFields

PREFER = ("size", "speed")


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
    load: str | tuple[int, ...] = opt((), "Concurrencies, e.g. 1,64: each candidate that passes "
                                          "(and the original, for reference) is served with "
                                          "`quantkit serve` on this machine (vLLM on a GPU, "
                                          "llama.cpp or transformers on CPU) and load-tested "
                                          "with `quantkit bench` at them, the servers in "
                                          "alternating order.")
    prefer: str = opt("size", "Which passing candidate wins: size (the smallest) or speed (the "
                              "fastest in output tokens/s at --load, the geometric mean over its "
                              "concurrencies, where its 95% interval clears the others' by "
                              "--speed-margin; within the noise the smaller).")
    speed_margin: float = opt(0.03, "--prefer speed: a larger candidate wins only where the "
                                    "interval of its speed over the smaller's clears 1 + this.")
    restarts: int | None = opt(None, "--load: server starts per candidate, each measured "
                                     "--repeats times (default: 2 on a GPU, 1 on CPU).")
    shared_hessians: bool = opt(False, "GPTQ candidates: Hessians from one pass of the original "
                                       "model, shared by all (--hessians original: each "
                                       "candidate costs its sweeps, at some quality: no error "
                                       "propagation); off: each quantized sequentially.")

    @property
    def ladder(self) -> tuple[str, ...]:
        method = METHODS.get(self.method)
        return self.candidates or (method.ladder if method else ())

    @property
    def loads(self) -> tuple[int, ...]:
        """--load as concurrencies, ascending (empty: speed is not measured)."""
        if self.load in ("", ()):
            return ()
        return parse_levels(self.load, "--load", "--load 1,64")

    def check(self) -> None:
        METHODS[self.method]  # an unknown method is BadInput with the closest name
        for name in self.ladder:
            parse_candidate(self.method, name)
        if self.prefer not in PREFER:
            raise BadInput(f"unknown --prefer {self.prefer!r}", "use --prefer size or --prefer speed")
        if not 0 <= self.speed_margin < 1:
            raise BadInput(f"--speed-margin {self.speed_margin} is outside [0, 1)",
                           "a share of the smaller candidate's speed, e.g. --speed-margin 0.03")
        if self.restarts is not None and not 1 <= self.restarts <= 20:
            raise BadInput(f"--restarts {self.restarts} is not 1 to 20", "e.g. --restarts 2")
        loads = self.loads  # a --load that is not a list of concurrencies: BadInput
        if self.prefer == "speed" and not loads:
            raise BadInput("--prefer speed needs the load to measure speed at",
                           "add --load, e.g. --load 1,64 (concurrent requests)")


def parse_candidate(method: str, name: str) -> CandidateFields:
    """A candidate's quantize settings from its name, in the method's own grammar."""
    return METHODS[method].parse(name)
