"""FP8 numerics: E4M3 weights with per-channel scales (`--method fp8`), FP8 activations per token
(dynamic) or per tensor (static, from the calibration set), and the group-scale grid of 4-bit
weights served with FP8 activations (W4A8).

What vLLM computes, so the checkpoint means the same thing on every engine:
- W8A8-FP8 (compressed-tensors ``float-quantized``): ``W ~= fp8(W / s) * s`` with ``s`` one per
  output row (max |W| / 448); inputs ``x ~= fp8(x / a) * a``, ``a`` per token (max |x| / 448) or
  one per tensor (static). transformers with compressed-tensors runs the same fake quantization
  on a CPU, which is how `quantkit validate` scores it.
- W4A8-FP8 (vLLM's CUTLASS W4A8 kernel, Hopper): int4 weights, group 128, symmetric; the bf16
  group scales are converted on loading into FP8 scales times one float32 scale per row
  (`vllm.model_executor.layers.quantization.utils.quant_utils.convert_bf16_scales_to_fp8`).
  `w4a8_grid` puts each row's scales on the grid that conversion keeps, before the weights are
  rounded to them, so the scales in the file are the ones the kernel uses (up to bf16's
  rounding) and transformers decodes the weights vLLM does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# vLLM's per-token FP8 quantization never uses a scale below this (csrc/quantization/fp8)
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def to_fp8(x: Tensor) -> Tensor:
    """Round to E4M3 (nearest even), saturating at +-448 as vLLM's quantization kernels do."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_fp8_weight(w: Tensor, scale_dtype: torch.dtype | None = None
                        ) -> tuple[Tensor, Tensor]:
    """Per-output-channel E4M3 of ``w[out, in]``: (fp8 values, scale [out, 1]). With
    `scale_dtype` the scales are rounded to it before use (the file stores them so)."""
    amax = w.detach().float().abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    if scale_dtype is not None:
        scale = scale.to(scale_dtype)
    return to_fp8(w.float() / scale.float()), scale


def dequantize_fp8(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return (q.float() * scale.float()).to(dtype)


def fake_fp8_tensor(x: Tensor, scale: Tensor) -> Tensor:
    """FP8 quantize-dequantize of `x` with `scale` (one per tensor: a static input_scale or a KV
    scale; or any shape that broadcasts)."""
    s = scale.float()
    return (to_fp8(x.float() / s).float() * s).to(x.dtype)


def fake_fp8_tokens(x: Tensor) -> Tensor:
    """Dynamic per-token FP8 quantize-dequantize of ``x[..., features]`` (vLLM's W8A8/W4A8 inputs)."""
    return fake_fp8_tensor(x, (x.float().abs().amax(dim=-1, keepdim=True) / FP8_MAX)
                           .clamp_min(FP8_MIN_SCALE))


def _w4a8_steps(scale: Tensor) -> tuple[Tensor, Tensor]:
    """vLLM's W4A8 loading of group scales ``[out, groups]``: per row c = max / 448 (at least
    its per-token floor); each scale becomes k = fp8(fp8(s / c) / 8) times 8c. Returns (k, 8c)."""
    s = scale.float()
    c = (s.amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(FP8_MIN_SCALE)
    return to_fp8(to_fp8(s / c).float() / 8.0).float(), c * 8.0


def vllm_w4a8_scales(scale: Tensor) -> Tensor:
    """What vLLM's W4A8 loading makes of 16-bit group scales ``[out, groups]``, in float32."""
    k, unit = _w4a8_steps(scale)
    return k * unit


def w4a8_grid(scale: Tensor) -> Tensor:
    """Group scales ``[out, groups]`` moved onto the grid vLLM's W4A8 loading keeps: each becomes
    what that loading would make of it (4 significant bits relative to its row's largest, which
    is unchanged), stored in the scales' dtype. vLLM's conversion of the result gives it back
    up to that dtype's rounding (bf16: 2**-9 relative), where unsnapped scales move by up to
    1/16. A group vLLM would zero (below 2**-9 of FP8's range) keeps FP8's smallest step."""
    k, unit = _w4a8_steps(scale)
    return (k.clamp_min(2.0 ** -9) * unit).to(scale.dtype)


def fp8_args(strategy: str, dynamic: bool = False) -> dict[str, Any]:
    """compressed-tensors QuantizationArgs fields of symmetric E4M3: weights per "channel",
    inputs per "token" (dynamic) or "tensor" (static), the KV cache per "tensor"."""
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy,
            "dynamic": dynamic}


def fp8_input_args(static: bool) -> dict[str, Any]:
    """FP8 inputs: per token and dynamic, or one static scale per tensor."""
    return fp8_args("tensor") if static else fp8_args("token", dynamic=True)
