"""AWQ, the built-in `--method awq`: activation-aware scales searched and folded into each
decoder layer, then clipping searched and weights rounded, into a compressed-tensors checkpoint;
its expert quantizer for mixtures of experts. `awq_fold` is GPTQ's --awq-scales too. The
searches are quantkit.quantize.awq's, the layer-by-layer machinery quantkit.quantize.layers'.
Imports no torch until a quantizer runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quantkit.method_registry import WEIGHT_LADDER, WEIGHT_LARGER, Method, register_method

if TYPE_CHECKING:
    from torch import Tensor, nn

    from quantkit.quantize.families import Family
    from quantkit.quantize.layers import Batch, ExpertQuantizer, LayerQuantizer, LinearResult, QuantSpec

# AWQ's grid searches see at most this many (evenly strided) tokens per layer: a GPU affords
# AutoAWQ's usual 128 x 512; a CPU gets a quarter, which keeps a 135M model to minutes
AWQ_SEARCH_TOKENS = {"cuda": 65536, "cpu": 16384}


def awq_fold(layer: nn.Module, family: Family, batches: list[Batch], spec: QuantSpec,
             index: int = 0) -> dict[str, Tensor]:
    """AWQ's first half: search the activation-aware scale of every mapping and fold it into the
    preceding norm or linear (the layer's outputs are unchanged). Returns the scaled inputs each
    linear then sees (strided to AWQ_SEARCH_TOKENS), for the clipping search."""
    import torch
    from torch import nn

    from quantkit.quantize.awq import awq_search_scale, fold_scales
    from quantkit.quantize.layers import linear, run_layer, tf32

    with torch.no_grad(), tf32():
        group_of = {n: spec.for_group(index, step) for step in family.sequential for n in step}
        total = sum(h.shape[0] * h.shape[1] for h, _ in batches)
        cap = AWQ_SEARCH_TOKENS.get(batches[0][0].device.type, AWQ_SEARCH_TOKENS["cpu"])
        stride = max(1, -(-total // cap))
        seen: dict[str, list[Tensor]] = {m.linears[0]: [] for m in family.awq}
        handles = [layer.get_submodule(name).register_forward_pre_hook(
            lambda _m, args, name=name: seen[name].append(
                args[0].reshape(-1, args[0].shape[-1])[::stride].float())) for name in seen]
        try:
            run_layer(layer, batches)
        finally:
            for h in handles:
                h.remove()
        x_of: dict[str, Tensor] = {}
        for mapping in family.awq:
            x = torch.cat(seen[mapping.linears[0]])
            prev: Any = layer.get_submodule(mapping.prev) if mapping.prev else None
            mods = [linear(layer, n) for n in mapping.linears]
            # a linear can only absorb scales if its last rows are the next inputs (not GQA v->o)
            if prev is not None and (not isinstance(prev, nn.Linear)
                                     or prev.out_features >= mods[0].in_features):
                gs = group_of[mapping.linears[0]]
                s, _, _ = awq_search_scale(x, [m.weight.data for m in mods], bits=gs.bits,
                                           group_size=gs.group_size, sym=gs.sym,
                                           biases=[m.bias for m in mods])
                new_w, new_b, new_next = fold_scales(prev.weight.data,
                                                     getattr(prev, "bias", None),
                                                     [m.weight.data for m in mods], s,
                                                     norm_offset=mapping.offset)
                prev.weight.data.copy_(new_w)
                if new_b is not None:
                    prev.bias.data.copy_(new_b)
                for m, nw in zip(mods, new_next):
                    m.weight.data.copy_(nw)
                x = x / s.to(x)
            for name in mapping.linears:
                x_of[name] = x
        return x_of


def awq_layer(layer: nn.Module, family: Family, batches: list[Batch],
              spec: QuantSpec, index: int = 0) -> dict[str, LinearResult]:
    """AWQ: search and fold activation-aware scales for every mapping, then clip and round.
    `index`: the layer's place in the model, which picks each group's scheme."""
    import torch

    from quantkit.quantize.layers import linear, tf32

    with torch.no_grad(), tf32():
        group_of = {n: spec.for_group(index, step) for step in family.sequential for n in step}
        x_of = awq_fold(layer, family, batches, spec, index)
        results: dict[str, LinearResult] = {}
        for name in family.linears:
            results[name] = awq_matrix(linear(layer, name).weight.data, x_of[name],
                                       group_of[name])
        return results


def awq_matrix(w: Tensor, x: Tensor, spec: QuantSpec) -> LinearResult:
    """AWQ's clipping search and rounding of weight `w` [out, in] fed by the (already scaled)
    inputs `x`: `w` holds the dequantized weights afterwards."""
    from quantkit.quantize.awq import apply_clip, awq_search_clip
    from quantkit.quantize.layers import LinearResult
    from quantkit.quantize.numerics import dequantize, quantize_rtn

    clipped = apply_clip(w, awq_search_clip(x, w, bits=spec.bits, group_size=spec.group_size,
                                            sym=spec.sym))
    q, scale, zero = quantize_rtn(clipped, spec.bits, spec.group_size, spec.sym, spec.scale_dtype,
                                  spec.snap)
    deq = dequantize(q, scale.to(w.dtype), zero, spec.group_size)
    ref = x @ w.float().T
    err = float((x @ (w.float() - deq.float()).T).pow(2).sum() / ref.pow(2).sum().clamp_min(1e-30))
    w.copy_(deq)
    return LinearResult(q, scale, None if spec.sym else zero, None, err, spec.bits,
                        spec.group_size)


def awq_expert(act: Callable[[Tensor], Tensor], gate_up: Tensor, down: Tensor, e: int,
               x: Tensor, spec: QuantSpec) -> tuple[LinearResult, LinearResult]:
    """AWQ of expert e: a scale folded from its up rows into down, then clipping and rounding."""
    from quantkit.quantize.awq import awq_search_scale, fold_scales
    from quantkit.quantize.experts import down_input

    x = _strided(x.float())
    z = down_input(act, gate_up.data[e], x)
    s, _, _ = awq_search_scale(z, [down.data[e]], bits=spec.bits, group_size=spec.group_size,
                               sym=spec.sym)
    new_up, _, (new_down,) = fold_scales(gate_up.data[e], None, [down.data[e]], s)
    gate_up.data[e].copy_(new_up)
    down.data[e].copy_(new_down)
    first = awq_matrix(gate_up.data[e], x, spec)
    z = down_input(act, gate_up.data[e], x.to(gate_up.dtype)).float()
    return first, awq_matrix(down.data[e], z, spec)


def _strided(x: Tensor) -> Tensor:
    """At most AWQ_SEARCH_TOKENS evenly strided tokens, as AWQ's searches see for dense layers."""
    cap = AWQ_SEARCH_TOKENS.get(x.device.type, AWQ_SEARCH_TOKENS["cpu"])
    return x[::max(1, -(-x.shape[0] // cap))]


register_method(Method("awq", "AWQ: activation-aware scales, compressed-tensors.",
                       layer=awq_layer, ladder=WEIGHT_LADDER,
                       larger=WEIGHT_LARGER, experts=awq_expert,
                       supports=frozenset({"w4a8", "w8_groups"}), instead="GPTQ with act_order"))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _layer: LayerQuantizer = awq_layer
    _expert: ExpertQuantizer = awq_expert
