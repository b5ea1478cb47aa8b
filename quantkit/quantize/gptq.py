"""GPTQ (Frantar et al., 2022): Hessian-aware column-by-column weight quantization.

Pure tensor functions; everything runs on the weight's device in float32. Quantized values,
scales and zero points follow the conventions of :mod:`quantkit.quantize.numerics`, so the
result packs directly into a compressed-tensors checkpoint that decodes to ``result.weight``.

``group_size=-1`` is per output channel. With ``act_order`` columns are processed by decreasing
Hessian diagonal. ``static_groups=True`` (compressed-tensors' ``actorder="weight"``) fixes each
contiguous group's qparams from the original weight up front, so no ``g_idx`` is needed on
disk; ``static_groups=False`` is GPTQ's ``desc_act``: groups follow processing order and the
column-to-group map is returned as ``g_idx`` (compressed-tensors >= 0.20 cannot store it).
Scales are computed and rounded in ``scale_dtype`` (default ``w.dtype``) before use, so a
checkpoint storing them in that dtype decodes to exactly ``result.weight``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from quantkit.errors import DegenerateCalibration
from quantkit.quantize.numerics import (
    compute_qparams,
    dequantize,
    num_groups,
    qrange,
    search_qparams,
)

_MAX_DAMP_RETRIES = 5


@dataclass
class GPTQResult:
    """Output of :func:`gptq_quantize_weight`."""

    q_int: Tensor  # int8 [out, in], signed grid
    scale: Tensor  # [out, n_groups] (or [out, 1] per-channel), in the scale dtype
    zero: Tensor  # int8, same shape as scale; all zeros when symmetric
    g_idx: Tensor | None  # int32 [in] column -> group, only for act-order with dynamic groups
    weight: Tensor  # dequantized in w's dtype: dequantize(q_int, scale.to(w.dtype), zero, g_idx)
    loss: float  # GPTQ's sum of (w - q)^2 / Hinv_ii^2 / 2


def accumulate_hessian(H: Tensor | None, x: Tensor, n_seen: int) -> tuple[Tensor, int]:
    """Fold inputs ``x[..., in]`` into the running mean ``H = 2/n X^T X`` (float32, in place)."""
    x = x.reshape(-1, x.shape[-1]).to(torch.float32)
    n_in = x.shape[-1]
    if H is None:
        H = torch.zeros(n_in, n_in, dtype=torch.float32, device=x.device)
    elif H.shape != (n_in, n_in):
        raise ValueError(f"Hessian shape {tuple(H.shape)} does not match in_features={n_in}")
    n = x.shape[0]
    if n == 0:
        return H, n_seen
    total = n_seen + n
    add_gram(H.mul_(n_seen / total), x, 2.0 / total)
    return H, total


GRAM_BLOCK = 256


def add_gram(H: Tensor, x: Tensor, alpha: float) -> Tensor:
    """``H += alpha * x^T x`` for symmetric H: the blocks on and above the diagonal, then the
    rest mirrored. Half of a full product's multiplications: 1.6x faster for 1536 columns on a
    2-core CPU (the demo model's down_proj), equal to it within float32 rounding."""
    n = x.shape[1]
    if n <= GRAM_BLOCK:
        return H.addmm_(x.T, x, alpha=alpha)
    for i in range(0, n, GRAM_BLOCK):
        j = i + GRAM_BLOCK
        H[i:j, i:].addmm_(x[:, i:j].T, x[:, i:], alpha=alpha)
        H[j:, i:j] = H[i:j, j:].T
    return H


def _inverse_hessian_cholesky(H: Tensor, damp: float) -> Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, raising damping on failure."""
    mean_diag = torch.diagonal(H).mean()
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    cur = tried = damp
    for _ in range(_MAX_DAMP_RETRIES):
        L, info = torch.linalg.cholesky_ex(H + (cur * mean_diag) * eye)
        if not info.item():
            U, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(L), upper=True)
            if not info.item():
                return U
        tried, cur = cur, cur * 10 if cur > 0 else 1e-3
    raise DegenerateCalibration(
        f"Hessian is not positive definite even with damping {tried:g} x mean(diag); "
        "the calibration inputs are probably degenerate (NaN/Inf or too few samples)"
    )


def _sweep(W1: Tensor, Q1: Tensor, S1: Tensor, Z1: Tensor, Hinv1: Tensor, q_min: int, q_max: int,
           start: int = 0, stop: int | None = None) -> None:
    """GPTQ's column loop inside one block: quantize column i, spread its error right (in place)."""
    for i in range(start, W1.shape[1] if stop is None else stop):
        w_col, s, z = W1[:, i], S1[:, i], Z1[:, i]
        q = torch.round(torch.clamp(w_col / s + z, q_min, q_max))
        Q1[:, i] = q
        err = (w_col - (q - z) * s) / Hinv1[i, i]
        W1[:, i + 1:].addr_(err, Hinv1[i, i + 1:], alpha=-1.0)


class _GraphedSweep:
    """`_sweep` over a whole block captured once as a CUDA graph and replayed for every block of
    that shape: a block's ~1,300 small kernels then cost their GPU time, not Python's launches."""

    def __init__(self, rows: int, cols: int, device: torch.device, q_min: int, q_max: int):
        f32 = torch.float32
        self.W1, self.Q1, self.Z1 = (torch.zeros(rows, cols, dtype=f32, device=device)
                                     for _ in range(3))
        self.S1 = torch.ones(rows, cols, dtype=f32, device=device)
        self.Hinv1 = torch.eye(cols, dtype=f32, device=device)
        args = (self.W1, self.Q1, self.S1, self.Z1, self.Hinv1, q_min, q_max)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graphs require
            _sweep(*args)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            _sweep(*args)

    def __call__(self, W1: Tensor, Q1: Tensor, S1: Tensor, Z1: Tensor, Hinv1: Tensor) -> None:
        for mine, given in ((self.W1, W1), (self.S1, S1), (self.Z1, Z1), (self.Hinv1, Hinv1)):
            mine.copy_(given)
        self.graph.replay()
        W1.copy_(self.W1)
        Q1.copy_(self.Q1)


USE_CUDA_GRAPHS = True  # bench/h200/gptq_graphs.py flips it to time both ways
_GRAPHS: dict[tuple[Any, ...], _GraphedSweep | None] = {}


def sweep_block(W1: Tensor, Q1: Tensor, S1: Tensor, Z1: Tensor, Hinv1: Tensor, q_min: int,
                q_max: int) -> None:
    """`_sweep` over the block, through a cached CUDA graph when the block is on a GPU (the same
    kernels, so the same numbers); eagerly on CPU or when capture fails."""
    key = (tuple(W1.shape), W1.device, q_min, q_max)
    if W1.is_cuda and USE_CUDA_GRAPHS and key not in _GRAPHS:
        if len(_GRAPHS) >= 8:
            _GRAPHS.clear()
        try:
            _GRAPHS[key] = _GraphedSweep(W1.shape[0], W1.shape[1], W1.device, q_min, q_max)
        except RuntimeError:  # a driver or allocator that cannot capture: eager is only slower
            _GRAPHS[key] = None
    graphed = _GRAPHS.get(key) if W1.is_cuda and USE_CUDA_GRAPHS else None
    if graphed is None:
        _sweep(W1, Q1, S1, Z1, Hinv1, q_min, q_max)
    else:
        graphed(W1, Q1, S1, Z1, Hinv1)


def gptq_quantize_weight(
    w: Tensor,
    H: Tensor,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    act_order: bool = False,
    static_groups: bool = True,
    damp: float = 0.01,
    block_size: int = 128,
    scale_dtype: torch.dtype | None = None,
    clip: str = "minmax",
    snap: Callable[[Tensor], Tensor] | None = None,
) -> GPTQResult:
    """Quantize ``w[out, in]`` with GPTQ given the input Hessian ``H[in, in]`` (see module doc)."""
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    if tuple(H.shape) != (in_f, in_f):
        raise ValueError(f"Hessian shape {tuple(H.shape)} does not match in_features={in_f}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_groups = num_groups(in_f, group_size)
    gs = in_f if group_size == -1 else group_size
    q_min, q_max = qrange(bits)
    sdtype = scale_dtype or (w.dtype if w.is_floating_point() else torch.float32)

    W = w.detach().to(torch.float32, copy=True)
    H = H.detach().to(device=W.device, dtype=torch.float32, copy=True)
    if not torch.isfinite(H).all():
        raise DegenerateCalibration("the Hessian contains NaN or Inf: the calibration "
                                    "activations overflow or are not finite")
    # columns never activated carry no information: pin them to 0 and make H invertible
    dead = torch.diagonal(H) == 0
    torch.diagonal(H)[dead] = 1
    W[:, dead] = 0

    # `snap` moves a row's scales together (W4A8's grid), so they are all fixed before the sweep
    dynamic = group_size != -1 and not (act_order and static_groups) and snap is None
    diag = torch.diagonal(H).clone()

    def qparams(cols: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        if clip == "mse":  # Hessian-weighted range search (numerics.search_qparams)
            return search_qparams(cols, bits, sym, weight)
        return compute_qparams(cols, bits, sym)

    if not dynamic:
        scale, zero = qparams(W.unflatten(1, (n_groups, gs)).to(sdtype),
                              diag.unflatten(0, (n_groups, gs)))
        if snap is not None:
            scale = snap(scale)
    else:
        scale = torch.empty(out_f, n_groups, dtype=sdtype, device=W.device)
        zero = torch.empty(out_f, n_groups, dtype=torch.int8, device=W.device)
        # groups must not straddle blocks so their qparams see fully updated columns
        block_size = max(gs, block_size // gs * gs)

    col_group = torch.arange(in_f, device=W.device) // gs
    perm = None
    if act_order:
        perm = torch.argsort(torch.diagonal(H), descending=True)
        W, H, col_group = W[:, perm], H[perm][:, perm], col_group[perm]

    diag_p = torch.diagonal(H).clone()  # in processing order, for the dynamic groups' search
    Hinv = _inverse_hessian_cholesky(H, damp)
    del H
    Q = torch.empty_like(W)
    loss = torch.zeros((), dtype=torch.float32, device=W.device)
    for i1 in range(0, in_f, block_size):
        i2 = min(i1 + block_size, in_f)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.empty_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        if dynamic:
            S1, Z1 = torch.empty_like(W1), torch.empty_like(W1)
            for g0 in range(0, i2 - i1, gs):
                g = (i1 + g0) // gs
                scale[:, g], zero[:, g] = qparams(W1[:, g0:g0 + gs].to(sdtype),
                                                  diag_p[i1 + g0:i1 + g0 + gs])
                S1[:, g0:g0 + gs] = scale[:, g:g + 1].to(torch.float32)
                Z1[:, g0:g0 + gs] = zero[:, g:g + 1].to(torch.float32)
                _sweep(W1, Q1, S1, Z1, Hinv1, q_min, q_max, g0, min(g0 + gs, i2 - i1))
        else:
            S1 = scale.to(torch.float32)[:, col_group[i1:i2]]
            Z1 = zero.to(torch.float32)[:, col_group[i1:i2]]
            sweep_block(W1, Q1, S1, Z1, Hinv1, q_min, q_max)
        # column i of W1 is final once quantized, so errors and losses vectorize afterwards
        Err1 = (W1 - (Q1 - Z1) * S1) / torch.diagonal(Hinv1)
        loss += Err1.square().sum() / 2
        Q[:, i1:i2] = Q1
        W[:, i2:].addmm_(Err1, Hinv[i1:i2, i2:], alpha=-1.0)

    g_idx = None
    if perm is not None:
        inv = torch.argsort(perm)
        Q = Q[:, inv]
        if dynamic:
            g_idx = (inv // gs).to(torch.int32)
    q_int = Q.to(torch.int8)
    weight = dequantize(q_int, scale.to(w.dtype), zero, group_size, g_idx)
    return GPTQResult(q_int=q_int, scale=scale, zero=zero, g_idx=g_idx, weight=weight,
                      loss=float(loss))
