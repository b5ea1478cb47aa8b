"""Mixture-of-experts layers: each expert quantized by its method's expert quantizer
(`Method.experts`: GPTQ's and AWQ's are in their modules of quantkit.methods) from the tokens the
router sends it, with every expert calibrated.

The experts module's input is captured once per layer (after the layer's dense groups are
quantized): the hidden states and each token's chosen experts. Expert e is calibrated on the
tokens routed to it; an expert that receives fewer than the floor's tokens is calibrated on all
calibration tokens instead (as llm-compressor's all-experts calibration does), and the manifest
says which. GPTQ quantizes each expert's stacked gate/up rows on one Hessian, then its down
matrix on the inputs the quantized gate/up produce. AWQ folds a scale between each expert's up
rows and its down matrix (exact per expert) and searches clipping for all three; the gate/up
inputs come from a norm every expert and the router share, so no per-expert scale folds there.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from quantkit.artifact import ExpertCoverage, LayerCoverage
    from quantkit.quantize.families import Experts
    from quantkit.quantize.layers import Batch, ExpertQuantizer, LinearResult, QuantSpec


def expert_forward(act: Callable[[Tensor], Tensor], gate_up: Tensor, down: Tensor, x: Tensor,
                   ) -> Tensor:
    """down(act(gate) * up) of one expert for tokens `x` (gate rows first in `gate_up`)."""
    return down_input(act, gate_up, x) @ down.T.to(x.dtype)


def down_input(act: Callable[[Tensor], Tensor], gate_up: Tensor, x: Tensor) -> Tensor:
    """act(gate) * up of one expert for tokens `x`: what its down matrix reads."""
    h = x @ gate_up.T.to(x.dtype)
    gate, up = h.chunk(2, dim=-1)
    return act(gate) * up


@dataclass(frozen=True)
class Coverage:
    """How many calibration tokens the router sent each expert of one layer, and which experts
    were calibrated on all tokens because theirs fell under the floor."""

    tokens: tuple[int, ...]
    floor: int

    @property
    def under_floor(self) -> list[int]:
        return [e for e, n in enumerate(self.tokens) if n < self.floor]

    def summary(self) -> LayerCoverage:
        return {"min": min(self.tokens), "median": statistics.median(self.tokens),
                "max": max(self.tokens), "under_floor": self.under_floor,
                "tokens": list(self.tokens)}


def expert_coverage(layers: dict[str, LayerCoverage], floor: int) -> ExpertCoverage:
    """The manifest's `experts` entry from the work folder's per-layer coverage: the floor, the
    tokens per expert over all layers (min, median), and per layer which experts were under it
    (calibrated on all tokens)."""
    tokens = [n for c in layers.values() for n in c["tokens"]]
    under = {i: c["under_floor"] for i, c in layers.items() if c["under_floor"]}
    return {"floor": floor, "min": min(tokens, default=0),
            "median": statistics.median(tokens) if tokens else 0,
            "under_floor": sum(map(len, under.values())), "experts": len(tokens),
            "under_floor_by_layer": under, "layers": layers}


def capture_routed(layer: nn.Module, experts: Experts, batches: list[Batch]
                   ) -> tuple[Tensor, Tensor]:
    """The experts module's input over every batch: hidden states [T, H] and each token's
    chosen experts [T, k] (the rest of the layer's forward is skipped)."""
    from quantkit.quantize.layers import _Stop

    hidden: list[Tensor] = []
    chosen: list[Tensor] = []

    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        values = list(args) + [kwargs[k] for k in ("hidden_states", "top_k_index") if k in kwargs]
        hidden.append(values[0].reshape(-1, values[0].shape[-1]))
        chosen.append(values[1].reshape(values[0].reshape(-1, values[0].shape[-1]).shape[0], -1))
        raise _Stop

    handle = layer.get_submodule(experts.module).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            for h, kw in batches:
                try:
                    layer(h, **kw)
                except _Stop:
                    pass
    finally:
        handle.remove()
    return torch.cat(hidden), torch.cat(chosen)


def count_routed(chosen: Tensor, count: int) -> tuple[int, ...]:
    """Tokens routed to each of `count` experts."""
    return tuple(int(n) for n in torch.bincount(chosen.reshape(-1).long(), minlength=count)[:count])


@torch.no_grad()
def quantize_experts(quantize: ExpertQuantizer, layer: nn.Module, experts: Experts, batches: list[Batch],
                     spec: QuantSpec) -> tuple[dict[str, LinearResult], Coverage]:
    """Quantize every expert of the layer in place with the method's expert quantizer (its fused
    parameters hold the dequantized weights afterwards); results keyed by the checkpoint's
    per-expert names."""
    mod = layer.get_submodule(experts.module)
    gate_up, down = getattr(mod, experts.gate_up), getattr(mod, experts.down)
    hidden, chosen = capture_routed(layer, experts, batches)
    coverage = Coverage(count_routed(chosen, experts.count), spec.expert_floor)
    results: dict[str, LinearResult] = {}
    for e in range(experts.count):
        routed = (chosen == e).any(dim=-1)
        x = hidden[routed] if coverage.tokens[e] >= coverage.floor else hidden
        first, second = quantize(cast(Callable[[Tensor], Tensor], mod.act_fn), gate_up, down,
                                 e, x, spec)
        for m in experts.matrices:
            r = first if m.param == experts.gate_up else second
            results[m.saved.format(e=e)] = _rows(r, m.start, m.stop)
    return results, coverage


def expert_errors(experts: Experts, results: dict[str, LinearResult]) -> dict[str, float]:
    """The worst relative output error of each per-expert matrix over the layer's experts,
    keyed `block_sparse_moe.experts.*.w1` (the manifest keeps one figure per matrix kind)."""
    return {m.saved.replace("{e}", "*"): max(results[m.saved.format(e=e)].error
                                              for e in range(experts.count))
            for m in experts.matrices}


def _rows(r: LinearResult, start: int, stop: int) -> LinearResult:
    from quantkit.quantize.layers import LinearResult

    return LinearResult(r.q_int[start:stop], r.scale[start:stop],
                        None if r.zero is None else r.zero[start:stop], None, r.error, r.bits,
                        r.group_size)
