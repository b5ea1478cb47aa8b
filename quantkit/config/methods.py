"""The built-in quantization methods' own options: one frozen dataclass per method (or family),
named by its entry in the method registry (quantkit.methods, `Method.options`). Their fields
join `QuantizeConfig` (flat under the recipe's `quantize:` section, one flag each, as the shared
options are); a method reads its own as `cfg.options()`, and each dataclass's `check(cfg)` is
asked by `QuantizeConfig.check` whatever the method (a wrong value is wrong anyway). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from quantkit.config.fields import opt
from quantkit.errors import BadInput
from quantkit.methods import GGUF_TYPES, Method, either, supporting, with_trait


class QuantizeSettings(Protocol):
    """What an options check reads of the settings it joins (`QuantizeConfig` has it): the
    method, its registry entry and the shared options that rule some of a method's out."""

    @property
    def method(self) -> str: ...

    @property
    def kv_cache(self) -> str: ...

    @property
    def traits(self) -> Method: ...

    @property
    def activation_store(self) -> str: ...


@dataclass(frozen=True)
class GPTQOptions:
    act_order: bool | None = opt(None, "GPTQ: columns by decreasing Hessian diagonal, static "
                                       "groups (default on for GPTQ, as in llm-compressor).")
    damp: float = opt(0.01, "GPTQ dampening, share of the mean Hessian diagonal.")
    clip: str = opt("minmax", "GPTQ scales: minmax (compressed-tensors' own), or mse: a grid of "
                              "shrunk ranges per group, the least Hessian-weighted error (AWQ "
                              "searches its own clipping).")
    awq_scales: bool = opt(False, "GPTQ: fold AWQ's activation-aware scales into each layer "
                                  "first, then run GPTQ on the rescaled weights (AWQ-then-GPTQ).")
    hessians: str = opt("sequential", "GPTQ: sequential (each layer's Hessians from the outputs "
                                      "of the layers already quantized) or original (from one "
                                      "pass of the original model, shared by every candidate of "
                                      "quantkit auto in a process; no error propagation).")

    def check(self, cfg: QuantizeSettings) -> None:
        """Its values, and what the method (by its traits) and the other options allow."""
        m = cfg.traits
        if self.clip not in ("minmax", "mse"):
            raise BadInput(f"unknown --clip {self.clip!r}", "use --clip minmax or --clip mse")
        if not 0 < self.damp < 1:
            raise BadInput(f"--damp {self.damp} must be between 0 and 1", "0.01 is the usual value")
        if self.act_order and "act_order" not in m.supports:
            raise BadInput(f"--act-order applies to {supporting('act_order')} only",
                           f"use --no-act-order with --method {cfg.method}")
        if self.hessians not in ("sequential", "original"):
            raise BadInput(f"unknown --hessians {self.hessians!r}",
                           "use --hessians sequential or --hessians original")
        if self.hessians == "original":
            if "hessians" not in m.supports:
                raise BadInput(f"--hessians applies to {supporting('hessians')} only",
                               f"leave it out with --method {cfg.method}")
            if cfg.activation_store == "disk":
                raise BadInput(f"--activations disk applies to {supporting('layerwise')} layer "
                               "by layer (the activations of --hessians original are never held "
                               "between layers)", "leave --activations out")
            if cfg.kv_cache == "fp8":
                raise BadInput("--kv-cache fp8 calibrates from each quantized layer's forward, "
                               "which --hessians original skips", "use --hessians sequential")
        if self.awq_scales and "awq_scales" not in m.supports:
            raise BadInput(f"--awq-scales applies to {supporting('awq_scales')} only",
                           either("--method", with_trait("awq_scales"))
                           + " --awq-scales, or leave --awq-scales out")
        if self.awq_scales and self.hessians == "original":
            raise BadInput("--awq-scales changes each layer's inputs, so the original model's "
                           "Hessians do not apply", "use --hessians sequential with --awq-scales")

    def uses_act_order(self, cfg: QuantizeSettings) -> bool:
        """On by default for a method with the act_order trait (GPTQ, as llm-compressor's:
        static act-order)."""
        return "act_order" in cfg.traits.supports if self.act_order is None else self.act_order


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
