"""FP8 W8A8, the built-in `--method fp8`: each linear's weights to E4M3 per output channel, its
activations FP8 per token at run time or (--static) per tensor from the calibration set, into a
compressed-tensors float-quantized checkpoint; its candidates (FP8, FP8-static). The FP8 numerics
are quantkit.fp8's, the layer-by-layer machinery quantkit.quantize.layers'. Imports no torch
until its quantizer runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import BadInput
from quantkit.method_registry import CandidateFields, Method, register_method

if TYPE_CHECKING:
    from torch import nn

    from quantkit.quantize.families import Family
    from quantkit.quantize.layers import Batch, LayerQuantizer, LinearResult, QuantSpec


def fp8_layer(layer: nn.Module, family: Family, batches: list[Batch],
              spec: QuantSpec, index: int = 0) -> dict[str, LinearResult]:
    """FP8 W8A8: each linear's weights to E4M3 per output channel (round to nearest: FP8's grid
    leaves nothing for a Hessian to fix); one forward gives each step's Hessian, for the relative
    output error the manifest records, and with static activations its input's largest value."""
    import torch

    from quantkit.fp8 import FP8_MAX, dequantize_fp8, quantize_fp8_weight
    from quantkit.quantize.layers import (
        LinearResult,
        layer_statistics,
        linear,
        relative_error,
        tf32,
    )

    with torch.no_grad(), tf32():
        hessians, _, amax = layer_statistics(layer, family, batches, keep_outputs=False)
        results: dict[str, LinearResult] = {}
        for step in family.sequential:
            for name in step:
                w = linear(layer, name).weight.data
                q, scale = quantize_fp8_weight(w, spec.scale_dtype)
                deq = dequantize_fp8(q, scale, w.dtype)
                err = relative_error(w, deq, hessians[step[0]])
                w.copy_(deq)
                input_scale = None
                if spec.act_fp8 == "static":
                    a = (amax[step[0]] / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
                    input_scale = a.reshape(1).to(spec.scale_dtype or torch.float32).cpu()
                results[name] = LinearResult(q, scale, None, None, err, 8, -1, input_scale)
        return results


def fp8_candidate(method: str, name: str) -> CandidateFields:
    """FP8 (activation scales per token, at run time) or FP8-static (one per tensor)."""
    key = name.strip().upper()
    if key not in ("FP8", "FP8-STATIC"):
        raise BadInput(f"unknown {method} candidate {name!r}", "use FP8 or FP8-static")
    return {"static": key == "FP8-STATIC", "group_size": -1}


register_method(Method("fp8", "FP8 W8A8: E4M3 weights per channel, FP8 activations per token "
                              "(--static: per tensor), compressed-tensors float-quantized: vLLM's "
                              "CUTLASS FP8 kernels on Hopper and Ada, transformers on a CPU.",
                       layer=fp8_layer, ladder=("FP8-static", "FP8"),
                       larger=("FP8",), candidate=fp8_candidate, float_weights=True,
                       fixed_bits=8, fixed_group=-1, fixed_activations="fp8",
                       supports=frozenset({"static"})))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _layer: LayerQuantizer = fp8_layer
