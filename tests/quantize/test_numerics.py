"""RTN numerics must be bit-identical to compressed-tensors' own quantize / fake_quantize."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import fake_quantize as ct_fake_quantize
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize
from compressed_tensors.quantization.utils import calculate_qparams

from quantkit.quantize.numerics import compute_qparams, dequantize, fake_quantize, quantize_rtn


def _ct_args(bits: int, group_size: int, sym: bool) -> QuantizationArgs:
    if group_size == -1:
        return QuantizationArgs(num_bits=bits, symmetric=sym, strategy="channel")
    return QuantizationArgs(num_bits=bits, symmetric=sym, strategy="group", group_size=group_size)


def _ct_qparams(w: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    # what llm-compressor's min-max observer feeds calculate_qparams
    if args.strategy == "channel":
        lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    else:
        g = w.unflatten(-1, (-1, args.group_size))
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    return calculate_qparams(lo, hi, args)


def _weight(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(48, 128) * 0.05
    w[:, 7] *= 20  # an outlier column
    w[0, :64] = 0.0  # an all-zero group (scale falls back to eps)
    w[1, :64] = w[1, :64].abs() + 0.01  # an all-positive group (min clamps to 0)
    w[2, 64:] = -w[2, 64:].abs()  # an all-negative group
    return w.to(dtype)


CASES = [
    (bits, gs, sym, dtype)
    for bits, gs in [(4, 32), (4, 64), (4, -1), (8, 32), (3, 64)]
    for sym in (True, False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16)
]


@pytest.mark.parametrize(("bits", "group_size", "sym", "dtype"), CASES)
def test_rtn_matches_compressed_tensors(bits, group_size, sym, dtype):
    w = _weight(dtype)
    args = _ct_args(bits, group_size, sym)
    ct_scale, ct_zero = _ct_qparams(w, args)
    q, scale, zero = quantize_rtn(w, bits, group_size, sym)

    assert scale.dtype == dtype and q.dtype == torch.int8 and zero.dtype == torch.int8
    assert torch.equal(scale, ct_scale)
    assert torch.equal(zero, ct_zero)
    if sym:
        assert not zero.any()
    assert torch.equal(q, ct_quantize(w, ct_scale, ct_zero, args, dtype=torch.int8))
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    assert q.min() >= lo and q.max() <= hi

    expected = ct_fake_quantize(w, ct_scale, ct_zero, args)
    assert torch.equal(dequantize(q, scale, zero, group_size).to(dtype), expected)
    assert torch.equal(fake_quantize(w, bits, group_size, sym), expected)


def test_symmetric_int4_grid():
    # scale = absmax / 7.5: +absmax clamps to 7, -absmax rounds (half to even) to -8
    w = torch.tensor([[-7.5, -0.5, 0.0, 0.5, 7.5, 1.5, -2.5, 3.0]])
    scale, zero = compute_qparams(w, 4, sym=True)
    assert torch.equal(scale, torch.tensor([1.0])) and not zero.any()
    q, _, _ = quantize_rtn(w, 4, 8, True)
    assert q[0, 0] == -8 and q[0, 4] == 7 and q[0, 2] == 0


def test_g_idx_identity_matches_grouped():
    w = _weight(torch.float32)
    q, scale, zero = quantize_rtn(w, 4, 32, False)
    g_idx = torch.arange(128) // 32
    assert torch.equal(dequantize(q, scale, zero, 32, g_idx), dequantize(q, scale, zero, 32))


def test_indivisible_group_size_raises():
    with pytest.raises(ValueError, match="128.*48|48.*128"):
        quantize_rtn(torch.randn(4, 128), 4, 48, True)


def test_range_search_is_never_worse_than_minmax_and_clips_outliers():
    from quantkit.quantize.numerics import _weighted_err, compute_qparams, qrange, search_qparams

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 8, 32, generator=g)
    w[:, :, 0] *= 6  # one outlier column per group stretches min/max
    imp = torch.rand(8, 32, generator=g) + 0.1
    q_min, q_max = qrange(4)
    for sym in (True, False):
        s0, z0 = compute_qparams(w, 4, sym)
        s1, z1 = search_qparams(w, 4, sym, imp)
        weight = imp.expand_as(w)
        e0 = _weighted_err(w, s0, z0, q_min, q_max, weight)
        e1 = _weighted_err(w, s1, z1, q_min, q_max, weight)
        assert (e1 <= e0).all() and e1.sum() < 0.98 * e0.sum()
        assert (s1 <= s0 + 1e-7).all()  # only ever shrinks the range
