"""One decoder layer at a time: feed it the calibration activations and quantize its linears."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from quantkit.quantize.awq import apply_clip, awq_search_clip, awq_search_scale, fold_scales
from quantkit.quantize.families import Family, group_label
from quantkit.quantize.gptq import accumulate_hessian, gptq_quantize_weight
from quantkit.quantize.numerics import dequantize, quantize_rtn

if TYPE_CHECKING:
    from quantkit.config import QuantizeConfig


def linear(layer: nn.Module, name: str) -> nn.Linear:
    """The linear `name` of a decoder layer (typed: Module.__getattr__ says Tensor | Module)."""
    return cast(nn.Linear, layer.get_submodule(name))

Batch = tuple[Tensor, dict[str, Any]]  # a layer's hidden-state input and its other arguments
# AWQ's grid searches see at most this many (evenly strided) tokens per layer: a GPU affords
# AutoAWQ's usual 128 x 512; a CPU gets a quarter, which keeps a 135M model to minutes
AWQ_SEARCH_TOKENS = {"cuda": 65536, "cpu": 16384}


@dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """What to quantize to: the method and every numeric parameter. Made from a QuantizeConfig
    (`from_config`), which owns every default."""

    method: str
    bits: int
    group_size: int
    sym: bool
    act_order: bool  # resolved (the checkpoint says it): GPTQ's columns by the Hessian diagonal
    expert_floor: int  # experts routed fewer calibration tokens are calibrated on all tokens
    upgrade: tuple[str, ...] = ()  # linear groups (Family.group_keys) kept at UPGRADE_BITS
    # the served model's activations: "" 16-bit, "dynamic" FP8 per token, "static" FP8 per
    # tensor (--method fp8 --static); with int weights "dynamic" is W4A8
    act_fp8: str = ""
    kv_fp8: bool = False  # calibrate per-tensor FP8 k/v scales for vLLM's FP8 KV cache
    # the checkpoint's floating dtype, the source's ("bfloat16"): scales are rounded to it and
    # unquantized tensors written in it, whatever dtype the work ran in; None: as computed
    store_dtype: str | None = None
    # the method's own options (Method.options, e.g. GPTQ's damp, clip and awq_scales), read from
    # the config; None where it has none
    options: Any = None

    @classmethod
    def from_config(cls, cfg: QuantizeConfig, upgrade: tuple[str, ...] = (),
                    store_dtype: str | None = None) -> QuantSpec:
        """The spec `cfg` asks for (act-order resolved, the method's fixed bits and group size
        applied; float weights are symmetric; the method's own options), with `upgrade`'s groups
        at 8 bits."""
        act = ("static" if cfg.static else "dynamic") if cfg.activation_format == "fp8" else ""
        return cls(method=cfg.method, bits=cfg.weight_bits, group_size=cfg.weight_group_size,
                   sym=cfg.traits.float_weights or cfg.sym, act_order=cfg.uses_act_order,
                   expert_floor=cfg.expert_floor, upgrade=upgrade, act_fp8=act,
                   kv_fp8=cfg.kv_cache == "fp8", store_dtype=store_dtype,
                   options=cfg.options())

    def settings(self) -> dict[str, Any]:
        """What the manifest records (and a resumed run must match): every field, the method's
        own options among them (the resolved act-order over the option's), as JSON reads it."""
        fields = {k: v for k, v in self.__dict__.items() if k != "options"}
        own = dataclasses.asdict(self.options) if self.options is not None else {}
        return {**own, **fields, "upgrade": list(self.upgrade)}

    @property
    def float_weights(self) -> bool:
        """Whether the method's weights are floating point (FP8), not integers on a grid."""
        from quantkit.methods import METHODS

        return METHODS[self.method].float_weights

    @property
    def snap(self) -> Callable[[Tensor], Tensor] | None:
        """W4A8: what moves group scales onto the grid vLLM's kernel keeps exactly (fp8.w4a8_grid)."""
        if self.act_fp8 and not self.float_weights:
            from quantkit.fp8 import w4a8_grid

            return w4a8_grid
        return None

    @property
    def scale_dtype(self) -> torch.dtype | None:
        """The torch dtype of `store_dtype` (None: each weight's own)."""
        return getattr(torch, self.store_dtype) if self.store_dtype else None

    def for_group(self, layer: int, step: tuple[str, ...]) -> QuantSpec:
        """The scheme of one linear group: this spec, or at UPGRADE_BITS if it is upgraded."""
        if f"{layer}:{group_label(step)}" in self.upgrade:
            return dataclasses.replace(self, bits=UPGRADE_BITS, upgrade=())
        return self


UPGRADE_BITS = 8


@dataclass
class LinearResult:
    """A quantized linear: grid values (int8, or float8_e4m3fn for FP8 weights), qparams, its
    relative output error and, with static FP8 activations, its input's scale."""

    q_int: Tensor
    scale: Tensor
    zero: Tensor | None
    g_idx: Tensor | None
    error: float
    bits: int
    group_size: int
    input_scale: Tensor | None = None


@contextmanager
def _tf32() -> Iterator[None]:
    """TF32 matmuls on CUDA for Hessians and AWQ searches: ~7x faster, and 1e-3 relative error
    sits far below GPTQ's 1e-2 dampening; CPU math is unaffected."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class _Stop(Exception):
    """Raised from a hook to skip the rest of a layer's forward once its input is seen."""


@torch.no_grad()
def run_layer(layer: nn.Module, batches: list[Batch],
              keep: Callable[[Tensor], Tensor] | None = None) -> list[Tensor]:
    """The layer's outputs for every batch, each passed through `keep` as it is made (to disk,
    when the activations wait there)."""
    outs = []
    for hidden, kwargs in batches:
        out = layer(hidden, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        outs.append(keep(out) if keep is not None else out)
    return outs


@torch.no_grad()
def _feed_inputs(layer: nn.Module, batches: list[Batch], name: str,
                 fn: Callable[[Tensor], None], stop: bool = True) -> None:
    """Call `fn` on the input of submodule `name` for every batch."""
    def hook(_mod: nn.Module, args: tuple[Tensor, ...]) -> None:
        fn(args[0])
        if stop:
            raise _Stop

    handle = layer.get_submodule(name).register_forward_pre_hook(hook)
    try:
        for hidden, kwargs in batches:
            try:
                layer(hidden, **kwargs)
            except _Stop:
                pass
    finally:
        handle.remove()


def _relative_error(w: Tensor, q: Tensor, H: Tensor) -> float:
    """||X (W - Q)^T||^2 / ||X W^T||^2 computed through H ~ X^T X."""
    d = (w - q).float()
    return float(((d @ H) * d).sum() / ((w.float() @ H) * w.float()).sum().clamp_min(1e-30))


@_tf32()
def gptq_layer(layer: nn.Module, family: Family, batches: list[Batch],
               spec: QuantSpec, index: int = 0,
               hessians: dict[str, Tensor] | None = None) -> dict[str, LinearResult]:
    """GPTQ, true-sequential: each step sees the inputs produced by the already quantized steps.
    `index`: the layer's place in the model, which picks each group's scheme. `hessians` (by
    each step's first linear, from `original_hessians`) replaces the feeding: `batches` unused.
    With GPTQ's `awq_scales` option, AWQ's activation-aware scales are folded in first
    (AWQ-then-GPTQ)."""
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
            _feed_inputs(layer, batches, step[0], accumulate)
        mods = [linear(layer, n) for n in step]
        # linears that read the same input share H: one stacked GPTQ sweep quantizes them all
        w = torch.cat([m.weight.data for m in mods])
        res = gptq_matrix(w, state["H"], gs)
        row = 0
        for name, mod in zip(step, mods):
            rows = slice(row, row + mod.out_features)
            row += mod.out_features
            err = _relative_error(mod.weight.data, w[rows], state["H"])
            mod.weight.data.copy_(w[rows])
            results[name] = LinearResult(res.q_int[rows], res.scale[rows],
                                         None if res.zero is None else res.zero[rows], None,
                                         err, gs.bits, gs.group_size)
    return results


def gptq_matrix(w: Tensor, H: Tensor, spec: QuantSpec) -> LinearResult:
    """GPTQ of weight `w` [out, in] with input Hessian `H`: `w` holds the dequantized weights
    afterwards. Act-order uses static groups: compressed-tensors >= 0.20 stores no g_idx."""
    res = gptq_quantize_weight(w, H, bits=spec.bits, group_size=spec.group_size, sym=spec.sym,
                               act_order=spec.act_order, static_groups=True,
                               damp=spec.options.damp, clip=spec.options.clip,
                               scale_dtype=spec.scale_dtype, snap=spec.snap)
    err = _relative_error(w, res.weight, H)
    w.copy_(res.weight)
    return LinearResult(res.q_int, res.scale, None if spec.sym else res.zero, None, err,
                        spec.bits, spec.group_size)


@torch.no_grad()
@_tf32()
def awq_fold(layer: nn.Module, family: Family, batches: list[Batch], spec: QuantSpec,
             index: int = 0) -> dict[str, Tensor]:
    """AWQ's first half: search the activation-aware scale of every mapping and fold it into the
    preceding norm or linear (the layer's outputs are unchanged). Returns the scaled inputs each
    linear then sees (strided to AWQ_SEARCH_TOKENS), for the clipping search."""
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
            new_w, new_b, new_next = fold_scales(prev.weight.data, getattr(prev, "bias", None),
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


@torch.no_grad()
@_tf32()
def awq_layer(layer: nn.Module, family: Family, batches: list[Batch],
              spec: QuantSpec, index: int = 0) -> dict[str, LinearResult]:
    """AWQ: search and fold activation-aware scales for every mapping, then clip and round.
    `index`: the layer's place in the model, which picks each group's scheme."""
    group_of = {n: spec.for_group(index, step) for step in family.sequential for n in step}
    x_of = awq_fold(layer, family, batches, spec, index)
    results: dict[str, LinearResult] = {}
    for name in family.linears:
        results[name] = awq_matrix(linear(layer, name).weight.data, x_of[name], group_of[name])
    return results


def awq_matrix(w: Tensor, x: Tensor, spec: QuantSpec) -> LinearResult:
    """AWQ's clipping search and rounding of weight `w` [out, in] fed by the (already scaled)
    inputs `x`: `w` holds the dequantized weights afterwards."""
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


@torch.no_grad()
@_tf32()
def fp8_layer(layer: nn.Module, family: Family, batches: list[Batch],
              spec: QuantSpec, index: int = 0) -> dict[str, LinearResult]:
    """FP8 W8A8: each linear's weights to E4M3 per output channel (round to nearest: FP8's grid
    leaves nothing for a Hessian to fix); one forward gives each step's Hessian, for the relative
    output error the manifest records, and with static activations its input's largest value."""
    from quantkit.fp8 import FP8_MAX, dequantize_fp8, quantize_fp8_weight

    hessians, _, amax = layer_statistics(layer, family, batches, keep_outputs=False)
    results: dict[str, LinearResult] = {}
    for step in family.sequential:
        for name in step:
            w = linear(layer, name).weight.data
            q, scale = quantize_fp8_weight(w, spec.scale_dtype)
            deq = dequantize_fp8(q, scale, w.dtype)
            err = _relative_error(w, deq, hessians[step[0]])
            w.copy_(deq)
            input_scale = None
            if spec.act_fp8 == "static":
                a = (amax[step[0]] / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
                input_scale = a.reshape(1).to(spec.scale_dtype or torch.float32).cpu()
            results[name] = LinearResult(q, scale, None, None, err, 8, -1, input_scale)
    return results


@torch.no_grad()
@_tf32()
def layer_hessians(layer: nn.Module, family: Family, batches: list[Batch]
                   ) -> tuple[dict[str, Tensor], list[Tensor]]:
    """Every step's Hessian from one forward of the layer as it is (no step quantized yet), and
    the layer's outputs: what `original_hessians` collects layer by layer."""
    hessians, outs, _ = layer_statistics(layer, family, batches)
    return hessians, outs


def layer_statistics(layer: nn.Module, family: Family, batches: list[Batch],
                     keep_outputs: bool = True
                     ) -> tuple[dict[str, Tensor], list[Tensor], dict[str, Tensor]]:
    """From one forward of the layer as it is: each step's input Hessian, the layer's outputs
    (unless not `keep_outputs`) and each step's largest input magnitude."""
    state: dict[str, dict[str, Any]] = {step[0]: {"H": None, "n": 0, "amax": None}
                                        for step in family.sequential}

    def hook(name: str) -> Callable[[nn.Module, tuple[Tensor, ...]], None]:
        def acc(_m: nn.Module, args: tuple[Tensor, ...]) -> None:
            st = state[name]
            st["H"], st["n"] = accumulate_hessian(st["H"], args[0], st["n"])
            top = args[0].detach().abs().amax().float()
            st["amax"] = top if st["amax"] is None else torch.maximum(st["amax"], top)
        return acc

    handles = [layer.get_submodule(n).register_forward_pre_hook(hook(n)) for n in state]
    try:
        outs = run_layer(layer, batches, None if keep_outputs else (lambda t: t.new_empty(0)))
    finally:
        for h in handles:
            h.remove()
    return ({n: st["H"] for n, st in state.items()}, outs,
            {n: st["amax"] for n, st in state.items()})
