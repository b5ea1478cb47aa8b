"""FP8 KV cache: one scale for the keys and one for the values of each decoder layer's attention,
calibrated from what the attention sees (keys after RoPE) on the calibration set, and the CPU
emulation of what vLLM's FP8 cache stores (``fp8(k / k_scale) * k_scale``).

The scales go into the checkpoint as ``<layer>.self_attn.k_scale`` / ``v_scale`` (float32 [1]),
with compressed-tensors' ``kv_cache_scheme`` (FP8, per tensor) in config.json: what vLLM's loader
maps onto its attention layers when it serves with ``--kv-cache-dtype fp8``. Both hooks work by
naming a transformers attention function that wraps the model's own (sdpa or eager).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from quantkit.fp8 import FP8_MAX, fake_fp8_tensor, fp8_args

KV_ATTENTION = "quantkit_fp8_kv"
KV_SCHEME = fp8_args("tensor")
KV_SUFFIXES = ("k_scale", "v_scale")

KVHook = Callable[[nn.Module, Tensor, Tensor], tuple[Tensor, Tensor]]


def _attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, *args: Any,
               **kwargs: Any) -> Any:
    """The registered attention function: the module's hook on keys and values, then the
    attention implementation the model had."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    hook: KVHook | None = getattr(module, "_quantkit_kv", None)
    if hook is not None:
        key, value = hook(module, key, value)
    base = getattr(module, "_quantkit_base_attention", "sdpa")
    if base == "eager":
        from importlib import import_module

        eager = import_module(type(module).__module__).eager_attention_forward
        return eager(module, query, key, value, *args, **kwargs)
    return ALL_ATTENTION_FUNCTIONS[base](module, query, key, value, *args, **kwargs)


def attention_modules(layer: nn.Module) -> dict[str, nn.Module]:
    """A decoder layer's self-attention module(s), by their name within the layer."""
    return {name: m for name, m in layer.named_modules()
            if name and type(m).__name__.endswith("Attention") and hasattr(m, "config")}


@contextmanager
def kv_hooked(modules: list[nn.Module], hook: KVHook) -> Iterator[None]:
    """Run `hook` on every key/value the attention `modules` see while the context is open."""
    from transformers import AttentionInterface

    AttentionInterface.register(KV_ATTENTION, _attention)
    if not modules:
        yield
        return
    config: Any = modules[0].config
    base = config._attn_implementation or "sdpa"
    hooked: list[Any] = list(modules)  # modules given attributes of ours
    for m in hooked:
        m._quantkit_kv, m._quantkit_base_attention = hook, base
    config._attn_implementation = KV_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = base
        for m in hooked:
            del m._quantkit_kv, m._quantkit_base_attention


class KVObserver:
    """The largest |key| and |value| each attention module sees (a `kv_hooked` hook)."""

    def __init__(self) -> None:
        self.amax: dict[int, tuple[Tensor, Tensor]] = {}

    def __call__(self, module: nn.Module, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        k, v = key.detach().abs().amax().float(), value.detach().abs().amax().float()
        old = self.amax.get(id(module))
        self.amax[id(module)] = (k, v) if old is None else (torch.maximum(old[0], k),
                                                            torch.maximum(old[1], v))
        return key, value

    def scales(self, module: nn.Module) -> dict[str, Tensor]:
        """{"k_scale", "v_scale"}: max / 448, float32 [1] (1.0 if the module never ran)."""
        k, v = self.amax.get(id(module), (torch.tensor(FP8_MAX), torch.tensor(FP8_MAX)))
        tiny = torch.finfo(torch.float32).tiny
        return {"k_scale": (k / FP8_MAX).clamp_min(tiny).reshape(1).cpu(),
                "v_scale": (v / FP8_MAX).clamp_min(tiny).reshape(1).cpu()}


def layer_kv_scales(layer: nn.Module, prefix: str, run: Callable[[], Any]
                    ) -> tuple[Any, dict[str, Tensor]]:
    """`run()` (a forward of the layer) with its attention observed: its result and the
    layer's k/v scale tensors under the checkpoint's names (`prefix` = "model.layers.3")."""
    mods = attention_modules(layer)
    observer = KVObserver()
    with kv_hooked(list(mods.values()), observer):
        result = run()
    tensors = {f"{prefix}.{name}.{key}": value for name, m in mods.items()
               for key, value in observer.scales(m).items()}
    return result, tensors


def emulate_fp8_kv(model: nn.Module, folder: Path) -> int:
    """Make a loaded transformers model store its KV cache as vLLM's FP8 cache would, with the
    checkpoint's scales: keys and values quantize-dequantized before attention. Returns how
    many attention modules got scales (0: the checkpoint has none)."""
    from safetensors import safe_open

    scales: dict[str, dict[str, Tensor]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                module, _, leaf = key.rpartition(".")
                if leaf in KV_SUFFIXES:
                    scales.setdefault(module, {})[leaf] = st.get_tensor(key).float()
    mods = {id(m): (m, scales[name]) for name, m in model.named_modules() if name in scales}

    def quantize(module: nn.Module, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        s = mods[id(module)][1]  # only the modules given scales are hooked
        return (fake_fp8_tensor(key, s["k_scale"].to(key.device)),
                fake_fp8_tensor(value, s["v_scale"].to(value.device)))

    if mods:
        hooked = kv_hooked([m for m, _ in mods.values()], quantize)
        hooked.__enter__()
        owner: Any = model
        owner._quantkit_kv_hooks = hooked  # open for the model's lifetime (closed if collected)
    return len(mods)
