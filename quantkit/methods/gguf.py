"""GGUF, the built-in `--method gguf`: llama.cpp k-quants with an importance matrix, by a
pipeline of its own (quantkit.quantize.gguf's `quantize_gguf`: convert, imatrix, quantize,
verify); its quant types, its candidates and its own options (--quant-type, --imatrix,
--threads, --heldout). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.errors import BadInput
from quantkit.method_registry import CandidateFields, Method, QuantizeSettings, register_method
from quantkit.option import opt

if TYPE_CHECKING:
    from quantkit.quantize import QuantizePipeline
    from quantkit.quantize.gguf import quantize_gguf

# llama.cpp types `quantize --method gguf` makes (llama_cpp.LLAMA_FTYPE_MOSTLY_*)
GGUF_TYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "IQ4_XS", "Q3_K_M", "Q4_0")


@dataclass(frozen=True)
class GGUFOptions:
    quant_type: str = opt("Q4_K_M", "gguf: Q4_K_M, Q4_K_S, Q5_K_M, Q6_K, Q8_0, IQ4_XS...")
    imatrix: bool = opt(True, "gguf: importance matrix from the calibration set.")
    threads: int = opt(0, "gguf: quantizer threads, 0 = all cores.")
    heldout: str | None = opt(None, "gguf: held-out text for the perplexity check "
                                    "(default: stdlib email package).")

    def check(self, cfg: QuantizeSettings) -> None:
        """Its values (the file system is `preflight`'s)."""
        if self.quant_type.upper() not in GGUF_TYPES:
            raise BadInput(f"unknown --quant-type {self.quant_type}",
                           "use one of " + ", ".join(GGUF_TYPES))
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 (all cores) or more",
                           "use --threads 0")

    def preflight(self) -> None:
        """The held-out file exists (`quantkit run`, before its first step)."""
        if self.heldout and not Path(self.heldout).is_file():
            raise BadInput(f"quantize.heldout {self.heldout} does not exist",
                           "fix the recipe's path")


def gguf_candidate(method: str, name: str) -> CandidateFields:
    """A llama.cpp quant type, e.g. Q4_K_M."""
    if name.upper() not in GGUF_TYPES:
        raise BadInput(f"unknown GGUF candidate {name!r}", "use " + ", ".join(GGUF_TYPES))
    return {"quant_type": name.upper()}


register_method(Method("gguf", "llama.cpp k-quants with an importance matrix.",
                       quantize="quantkit.quantize.gguf:quantize_gguf", checkpoint="gguf",
                       ladder=("Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"),
                       larger=("Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0"),
                       candidate=gguf_candidate, supports=frozenset({"moe"}),
                       options="quantkit.methods.gguf:GGUFOptions"))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _pipeline: QuantizePipeline = quantize_gguf  # named, imported when used
