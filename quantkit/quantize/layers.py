"""One decoder layer at a time, what every layer quantizer shares (the methods' own are their
modules', quantkit.methods): the spec it quantizes to, what it gives back for each linear, and
feeding the layer its calibration activations (each step's inputs, Hessians, outputs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor, nn

from quantkit.quantize.families import Family, group_label
from quantkit.quantize.gptq import accumulate_hessian

if TYPE_CHECKING:
    from quantkit.config import QuantizeConfig


def linear(layer: nn.Module, name: str) -> nn.Linear:
    """The linear `name` of a decoder layer (typed: Module.__getattr__ says Tensor | Module)."""
    return cast(nn.Linear, layer.get_submodule(name))

Batch = tuple[Tensor, dict[str, Any]]  # a layer's hidden-state input and its other arguments


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
        from quantkit.method_registry import METHODS

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


class LayerQuantizer(Protocol):
    """A layerwise method's layer quantizer (`Method.layer`, which the layer-by-layer engine calls):
    one decoder layer quantized in place, given its inputs and the settings; each linear's result
    by name. (A method with the `hessians` trait also takes `hessians=`, each step's Hessian by
    its first linear.)"""

    def __call__(self, layer: nn.Module, family: Family, batches: list[Batch], spec: QuantSpec,
                 index: int = 0, /) -> dict[str, LinearResult]: ...


class ExpertQuantizer(Protocol):
    """A method's expert quantizer (`Method.experts`, which quantize/experts.py calls): expert `e`
    of a mixture-of-experts layer on the tokens routed to it -> gate/up's and down's results."""

    def __call__(self, act: Callable[[Tensor], Tensor], gate_up: Tensor, down: Tensor, e: int,
                 x: Tensor, spec: QuantSpec, /) -> tuple[LinearResult, LinearResult]: ...


@contextmanager
def tf32() -> Iterator[None]:
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
def feed_inputs(layer: nn.Module, batches: list[Batch], name: str,
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


def relative_error(w: Tensor, q: Tensor, H: Tensor) -> float:
    """||X (W - Q)^T||^2 / ||X W^T||^2 computed through H ~ X^T X."""
    d = (w - q).float()
    return float(((d @ H) * d).sum() / ((w.float() @ H) * w.float()).sum().clamp_min(1e-30))


@torch.no_grad()
@tf32()
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
