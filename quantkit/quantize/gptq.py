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

from dataclasses import dataclass

import torch
from torch import Tensor

from quantkit.errors import DegenerateCalibration
from quantkit.quantize.numerics import compute_qparams, dequantize, num_groups, qrange

_MAX_DAMP_RETRIES = 5


@dataclass
class GPTQResult:
    """Output of :func:`gptq_quantize_weight`."""

    q_int: Tensor  # int8 [out, in], signed grid
    scale: Tensor  # [out, n_groups] (or [out, 1] per-channel), in the scale dtype
    zero: Tensor  # int8, same shape as scale; all zeros when symmetric
    g_idx: Tensor | None  # int32 [in] column -> group, only for act-order with dynamic groups
    weight: Tensor  # dequantized weight, w's dtype; equals dequantize(q_int, scale, zero, g_idx)
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
    H.mul_(n_seen / total).addmm_(x.T, x, alpha=2.0 / total)
    return H, total


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

    dynamic = group_size != -1 and not (act_order and static_groups)
    if not dynamic:
        scale, zero = compute_qparams(W.unflatten(1, (n_groups, gs)).to(sdtype), bits, sym)
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
        else:
            S1 = scale.to(torch.float32)[:, col_group[i1:i2]]
            Z1 = zero.to(torch.float32)[:, col_group[i1:i2]]
        for i in range(i2 - i1):
            if dynamic and i % gs == 0:
                g = (i1 + i) // gs
                scale[:, g], zero[:, g] = compute_qparams(W1[:, i:i + gs].to(sdtype), bits, sym)
                S1[:, i:i + gs] = scale[:, g:g + 1].to(torch.float32)
                Z1[:, i:i + gs] = zero[:, g:g + 1].to(torch.float32)
            w_col, s, z = W1[:, i], S1[:, i], Z1[:, i]
            q = torch.round(torch.clamp(w_col / s + z, q_min, q_max))
            Q1[:, i] = q
            err = (w_col - (q - z) * s) / Hinv1[i, i]
            W1[:, i + 1:].addr_(err, Hinv1[i, i + 1:], alpha=-1.0)
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
    weight = dequantize(q_int, scale, zero, group_size, g_idx).to(w.dtype)
    return GPTQResult(q_int=q_int, scale=scale, zero=zero, g_idx=g_idx, weight=weight,
                      loss=float(loss))
