"""Integer weight quantization numerics, bit-identical to compressed-tensors' fake-quant.

Conventions (those of compressed-tensors' ``int`` type, used by its pack-quantized format):
quantized values are signed, ``q in [-2**(bits-1), 2**(bits-1) - 1]`` stored as int8;
``zero`` is a signed int8 zero point that is all zeros for symmetric quantization;
``w ~= (q - zero) * scale``. Scales have shape ``[out, in // group_size]``, or ``[out, 1]``
for ``group_size == -1`` (per output channel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def qrange(bits: int) -> tuple[int, int]:
    """Return (q_min, q_max) of the signed integer grid for ``bits``."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in [1, 8], got {bits}")
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def num_groups(in_features: int, group_size: int) -> int:
    """Return the number of quantization groups along the input dimension."""
    if group_size == -1:
        return 1
    if group_size <= 0:
        raise ValueError(f"group_size must be positive or -1 (per-channel), got {group_size}")
    if in_features % group_size:
        raise ValueError(
            f"in_features={in_features} is not divisible by group_size={group_size}"
        )
    return in_features // group_size


def compute_qparams(w: Tensor, bits: int, sym: bool) -> tuple[Tensor, Tensor]:
    """Min/max scale and int8 zero point per row of ``w[..., n]``, as compressed-tensors does."""
    q_min, q_max = qrange(bits)
    # 0.0 must stay exactly representable, so the range always includes it
    min_val = torch.clamp(w.amin(dim=-1), max=0)
    max_val = torch.clamp(w.amax(dim=-1), min=0)
    # a 0-dim tensor on w's device, like compressed-tensors': CUDA divides by a Python scalar
    # as a multiply by its reciprocal, which can differ in the last bit
    bit_range = torch.full((), float(q_max - q_min), dtype=w.dtype, device=w.device)
    if sym:
        # the grid [-8, 7] is asymmetric; compressed-tensors divides by half of 15, not by 7 or 8
        scale = torch.maximum(min_val.abs(), max_val) / (bit_range / 2)
    else:
        scale = (max_val - min_val) / bit_range
    empty = scale == 0
    scale = torch.where(empty, torch.finfo(scale.dtype).eps, scale)
    if sym:
        zero = torch.zeros_like(scale)
    else:
        # compressed-tensors computes 0/0 = NaN here for all-zero rows and casts it to int8
        # (0 on common hardware); define it as 0 so q and zero are 0 for such rows
        zero = torch.clamp(q_min - min_val / scale, q_min, q_max).masked_fill(empty, 0)
    zero = torch.round(zero).to(torch.int8)
    return scale, zero


MSE_GRID, MSE_MAX_SHRINK = 20, 0.25


def search_qparams(w: Tensor, bits: int, sym: bool, importance: Tensor | None = None,
                   grid: int = MSE_GRID, max_shrink: float = MSE_MAX_SHRINK
                   ) -> tuple[Tensor, Tensor]:
    """Scale and zero per row of ``w[..., n]`` from a grid of shrunk min/max ranges: the one whose
    rounding error, weighted by ``importance[..., n]`` (GPTQ: the Hessian diagonal, how much each
    input column matters to the output), is least. Shrink 1 is `compute_qparams`' range, so the
    result is never worse than min/max on this error."""
    q_min, q_max = qrange(bits)
    weight = torch.ones_like(w) if importance is None else importance.expand_as(w).to(w.dtype)
    best_scale, best_zero = compute_qparams(w, bits, sym)
    best_err = _weighted_err(w, best_scale, best_zero, q_min, q_max, weight)
    lo, hi = torch.clamp(w.amin(dim=-1), max=0), torch.clamp(w.amax(dim=-1), min=0)
    for i in range(1, grid + 1):
        f = 1.0 - max_shrink * i / grid
        clipped = torch.maximum(torch.minimum(w, (hi * f).unsqueeze(-1)), (lo * f).unsqueeze(-1))
        scale, zero = compute_qparams(clipped, bits, sym)
        err = _weighted_err(w, scale, zero, q_min, q_max, weight)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
    return best_scale, best_zero


def _weighted_err(w: Tensor, scale: Tensor, zero: Tensor, q_min: int, q_max: int,
                  weight: Tensor) -> Tensor:
    s, z = scale.unsqueeze(-1), zero.unsqueeze(-1).to(w.dtype)
    deq = (torch.round(torch.clamp(w / s + z, q_min, q_max)) - z) * s
    return ((w - deq).float().square() * weight.float()).sum(-1)


def _grouped(w: Tensor, group_size: int) -> Tensor:
    """View ``w[out, in]`` as ``[out, n_groups, group_size]``."""
    return w.unflatten(-1, (num_groups(w.shape[-1], group_size), -1))


def _expand(p: Tensor, group_size: int, in_features: int, g_idx: Tensor | None) -> Tensor:
    """Broadcast per-group ``p[out, n_groups]`` to per-column ``[out, in]``."""
    if g_idx is not None:
        return p[:, g_idx.long()]
    if group_size == -1:
        return p.expand(-1, in_features)
    return p.repeat_interleave(group_size, dim=1)


def quantize(
    w: Tensor, scale: Tensor, zero: Tensor | None, bits: int, group_size: int,
    g_idx: Tensor | None = None,
) -> Tensor:
    """Quantize ``w[out, in]`` with given per-group qparams to int8 values on the signed grid."""
    q_min, q_max = qrange(bits)
    if g_idx is not None:
        s = _expand(scale, group_size, w.shape[-1], g_idx)
        z = None if zero is None else _expand(zero, group_size, w.shape[-1], g_idx)
        x = w / s
        if z is not None:
            x = x + z.to(w.dtype)
        return torch.round(torch.clamp(x, q_min, q_max)).to(torch.int8)
    # same op order and dtypes as compressed_tensors' _quantize, so results are bit-identical
    x = _grouped(w, group_size) / scale.unsqueeze(-1)
    if zero is not None:
        x = x + zero.unsqueeze(-1).to(w.dtype)
    return torch.round(torch.clamp(x, q_min, q_max)).to(torch.int8).flatten(-2)


def dequantize(
    q_int: Tensor, scale: Tensor, zero: Tensor | None, group_size: int,
    g_idx: Tensor | None = None,
) -> Tensor:
    """Return ``(q - zero) * scale`` in ``scale.dtype``; ``g_idx[in]`` maps columns to groups."""
    if g_idx is not None:
        w = q_int.to(scale.dtype)
        if zero is not None:
            w = w - _expand(zero, group_size, q_int.shape[-1], g_idx).to(scale.dtype)
        return w * _expand(scale, group_size, q_int.shape[-1], g_idx)
    w = _grouped(q_int, group_size).to(scale.dtype)
    if zero is not None:
        w = w - zero.unsqueeze(-1).to(scale.dtype)
    return (w * scale.unsqueeze(-1)).flatten(-2)


def quantize_rtn(
    w: Tensor, bits: int, group_size: int, sym: bool, scale_dtype: torch.dtype | None = None,
    snap: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Round-to-nearest quantization of ``w[out, in]``; returns (q_int int8, scale, zero int8).
    With ``scale_dtype`` the scales are rounded to it before use, so a checkpoint storing them in
    that dtype decodes to exactly ``dequantize(q_int, scale, zero)``; `snap` then moves them
    (W4A8's grid) before the weights are rounded."""
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    scale, zero = compute_qparams(_grouped(w, group_size), bits, sym)
    if scale_dtype is not None and scale_dtype != scale.dtype:
        scale = scale.to(scale_dtype)
    if snap is not None:
        scale = snap(scale)
    if scale.dtype != w.dtype:
        return quantize(w, scale.to(w.dtype), zero, bits, group_size), scale, zero
    return quantize(w, scale, zero, bits, group_size), scale, zero


def fake_quantize(w: Tensor, bits: int, group_size: int, sym: bool) -> Tensor:
    """Quantize-dequantize ``w[out, in]`` with RTN; same dtype and shape as ``w``."""
    q, scale, zero = quantize_rtn(w, bits, group_size, sym)
    return dequantize(q, scale, zero, group_size).to(w.dtype)
