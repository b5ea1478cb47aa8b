"""GPTQ's Hessians from one pass of the original model (`--hessians original`), kept in this
process so that every candidate `quantkit auto` quantizes from the same model and calibration
set reuses them: a candidate then costs its sweeps and packing, not a calibration pass.

Sequential GPTQ (the default) computes each layer's Hessians from the outputs of the layers
already quantized, so its Hessians belong to one candidate; these come from the original model's
activations, the same for all."""

from __future__ import annotations

from typing import Any

from torch import Tensor

_CACHE: dict[tuple[Any, ...], list[dict[str, Tensor]]] = {}
CACHE_MAX_BYTES = 8 * 2**30  # larger sets are recomputed per candidate rather than held in RAM


def original_hessians(lm: Any, family: Any, samples: list[list[int]], dev: Any,
                      batch_tokens: int, key: tuple[Any, ...]) -> list[dict[str, Tensor]]:
    """Per decoder layer, {first linear of each GPTQ step: H} from the original model's
    activations (on the CPU); `key` names the model and calibration set for the cache."""
    if key in _CACHE:
        return _CACHE[key]
    from quantkit.quantize.capture import capture_inputs, next_inputs
    from quantkit.quantize.layers import layer_hessians

    layers = lm.get_submodule(family.layers_attr)
    batches = capture_inputs(lm, family.layers_attr, samples, dev, batch_tokens)
    out: list[dict[str, Tensor]] = []
    for layer in layers:
        layer.to(dev)
        hs, outs = layer_hessians(layer, family, batches)
        out.append({n: h.cpu() for n, h in hs.items()})
        batches = next_inputs(outs, batches)
        layer.to("cpu")
    size = sum(h.numel() * h.element_size() for d in out for h in d.values())
    if size <= CACHE_MAX_BYTES:
        _CACHE.clear()  # one model and calibration set at a time
        _CACHE[key] = out
    return out
