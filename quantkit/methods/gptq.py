"""GPTQ, the built-in `--method gptq`: Hessian-aware rounding of each decoder layer,
true-sequential, into a compressed-tensors checkpoint; its expert quantizer for mixtures of
experts; its own options (--act-order, --damp, --clip, --awq-scales, --hessians). The numerics
are quantkit.quantize.gptq's, the layer-by-layer machinery quantkit.quantize.layers'. Imports no
torch until a quantizer runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantkit.errors import BadInput
from quantkit.method_registry import (
    WEIGHT_LADDER,
    WEIGHT_LARGER,
    Method,
    QuantizeSettings,
    either,
    register_method,
    supporting,
    with_trait,
)
from quantkit.option import opt

if TYPE_CHECKING:
    from torch import Tensor, nn

    from quantkit.quantize.families import Family
    from quantkit.quantize.layers import Batch, ExpertQuantizer, LayerQuantizer, LinearResult, QuantSpec


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

    @property
    def original_hessians(self) -> bool:
        """--hessians original: every layer's Hessians from one pass of the original model."""
        return self.hessians == "original"


def gptq_instead(parameters: Mapping[str, Any]) -> str:
    return "AWQ" if parameters.get("act_order") else "GPTQ with act_order, or AWQ,"


def gptq_layer(layer: nn.Module, family: Family, batches: list[Batch],
               spec: QuantSpec, index: int = 0,
               hessians: dict[str, Tensor] | None = None) -> dict[str, LinearResult]:
    """GPTQ, true-sequential: each step sees the inputs produced by the already quantized steps.
    `index`: the layer's place in the model, which picks each group's scheme. `hessians` (by
    each step's first linear, from `original_hessians`) replaces the feeding: `batches` unused.
    With GPTQ's `awq_scales` option, AWQ's activation-aware scales are folded in first
    (AWQ-then-GPTQ)."""
    import torch

    from quantkit.methods.awq import awq_fold
    from quantkit.quantize.gptq import accumulate_hessian
    from quantkit.quantize.layers import LinearResult, feed_inputs, linear, relative_error, tf32

    with tf32():
        if spec.options.awq_scales:
            awq_fold(layer, family, batches, spec, index)
        results: dict[str, LinearResult] = {}
        for step in family.sequential:
            gs = spec.for_group(index, step)
            state: dict[str, Any] = {"H": None, "n": 0}

            def accumulate(x: Tensor, state: dict[str, Any] = state) -> None:
                state["H"], state["n"] = accumulate_hessian(state["H"], x, state["n"])

            if hessians is not None:
                state["H"] = hessians[step[0]].to(linear(layer, step[0]).weight.device)
            else:
                feed_inputs(layer, batches, step[0], accumulate)
            mods = [linear(layer, n) for n in step]
            # linears that read the same input share H: one stacked GPTQ sweep quantizes them all
            w = torch.cat([m.weight.data for m in mods])
            res = gptq_matrix(w, state["H"], gs)
            row = 0
            for name, mod in zip(step, mods):
                rows = slice(row, row + mod.out_features)
                row += mod.out_features
                err = relative_error(mod.weight.data, w[rows], state["H"])
                mod.weight.data.copy_(w[rows])
                results[name] = LinearResult(res.q_int[rows], res.scale[rows],
                                             None if res.zero is None else res.zero[rows], None,
                                             err, gs.bits, gs.group_size)
        return results


def gptq_matrix(w: Tensor, H: Tensor, spec: QuantSpec) -> LinearResult:
    """GPTQ of weight `w` [out, in] with input Hessian `H`: `w` holds the dequantized weights
    afterwards. Act-order uses static groups: compressed-tensors >= 0.20 stores no g_idx."""
    from quantkit.quantize.gptq import gptq_quantize_weight
    from quantkit.quantize.layers import LinearResult, relative_error

    res = gptq_quantize_weight(w, H, bits=spec.bits, group_size=spec.group_size, sym=spec.sym,
                               act_order=spec.act_order, static_groups=True,
                               damp=spec.options.damp, clip=spec.options.clip,
                               scale_dtype=spec.scale_dtype, snap=spec.snap)
    err = relative_error(w, res.weight, H)
    w.copy_(res.weight)
    return LinearResult(res.q_int, res.scale, None if spec.sym else res.zero, None, err,
                        spec.bits, spec.group_size)


def gptq_expert(act: Callable[[Tensor], Tensor], gate_up: Tensor, down: Tensor, e: int,
                x: Tensor, spec: QuantSpec) -> tuple[LinearResult, LinearResult]:
    """GPTQ of expert e: gate/up on its tokens' Hessian, then down on what they produce."""
    from quantkit.quantize.experts import down_input
    from quantkit.quantize.gptq import accumulate_hessian

    H, _ = accumulate_hessian(None, x, 0)
    first = gptq_matrix(gate_up.data[e], H, spec)
    z = down_input(act, gate_up.data[e], x.to(gate_up.dtype))
    H2, _ = accumulate_hessian(None, z, 0)
    return first, gptq_matrix(down.data[e], H2, spec)


register_method(Method("gptq", "GPTQ: Hessian-aware rounding, compressed-tensors (vLLM, "
                               "transformers).",
                       layer=gptq_layer, ladder=WEIGHT_LADDER,
                       larger=WEIGHT_LARGER, experts=gptq_expert,
                       supports=frozenset({"act_order", "hessians", "awq_scales", "w4a8",
                                           "w8_groups"}),
                       options="quantkit.methods.gptq:GPTQOptions", instead=gptq_instead))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _layer: LayerQuantizer = gptq_layer
    _expert: ExpertQuantizer = gptq_expert
