"""Round-to-nearest, the simplest layerwise method: each linear on its own, no calibration; one
option of its own (--rtn-clip, `options.RTNOptions`), which its layer quantizer reads as
`spec.options`."""

from __future__ import annotations

from typing import Any

from quantkit.methods import Method


def rtn_layer(layer: Any, family: Any, batches: Any, spec: Any, index: int = 0) -> dict[str, Any]:
    """The layer quantizer: every linear of `layer` rounded to its grid in place."""
    from quantkit.quantize.layers import LinearResult
    from quantkit.quantize.numerics import dequantize, quantize_rtn

    clip = spec.options.rtn_clip  # its own option (--rtn-clip)
    results = {}
    for name in family.linears:
        mod = layer.get_submodule(name)
        w = mod.weight.data
        q, scale, zero = quantize_rtn(w, spec.bits, spec.group_size, spec.sym,
                                      snap=lambda s: s * clip)
        deq = dequantize(q, scale, zero, spec.group_size).to(w.dtype)
        err = float((w - deq).float().pow(2).sum() / w.float().pow(2).sum())
        mod.weight.data.copy_(deq)
        results[name] = LinearResult(q, scale, None if spec.sym else zero, None, err, spec.bits,
                                     spec.group_size)
    return results


RTN = Method("rtn", "round-to-nearest", layer="quantkit_toy_plugin.method:rtn_layer",
             ladder=("W4g32", "W8"), options="quantkit_toy_plugin.options:RTNOptions")
