"""AWQ (Lin et al., 2023) numerics: activation-aware scale search, clip search, scale folding.

Pure tensor functions in the formulation of AutoAWQ. Scaling input channel ``j`` of the next
linears by ``s_j`` and dividing the previous op's output channel ``j`` by ``s_j`` leaves the
float model unchanged but moves quantization error away from salient (large-activation)
channels. Fake quantization is :func:`quantkit.quantize.numerics.fake_quantize`, so the search
optimises exactly what the compressed-tensors checkpoint will decode to.

Scale search: ratio ``r`` takes the values ``i / grid`` (AutoAWQ's grid, so ``r = 0`` is plain
RTN); ``s = mean|x| ** r`` (divided by ``mean|w| ** (1 - r)`` with ``duo_scaling``), normalised
by ``sqrt(max(s) * min(s))``. The error is the MSE of ``forward(y)`` where ``y`` is the
concatenated outputs of the searched linears, or of ``y`` itself when ``forward`` is None.
Clip search: per group, the threshold ``max|w| * (1 - i / n_grid)`` for ``i < max_shrink *
n_grid`` minimising that group's partial-dot-product error on ``n_sample_tokens`` strided tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from quantkit.errors import DegenerateCalibration
from quantkit.quantize.numerics import fake_quantize, num_groups


def _linear_outputs(
    x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor | None]
) -> Tensor:
    """Concatenated outputs of the linears ``weights`` applied to ``x``."""
    outs = [torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases)]
    return torch.cat(outs, dim=-1)


def awq_search_scale(
    x: Tensor,
    weights: Sequence[Tensor],
    forward: Callable[[Tensor], Tensor] | None = None,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    grid: int = 20,
    duo_scaling: bool = False,
    biases: Sequence[Tensor | None] | None = None,
) -> tuple[Tensor, float, list[float]]:
    """Search scales [in] for linears ``weights[i][out_i, in]`` fed by ``x``; see module doc."""
    if not weights:
        raise ValueError("awq_search_scale needs at least one weight")
    in_f = x.shape[-1]
    for w in weights:
        if w.ndim != 2 or w.shape[1] != in_f:
            raise ValueError(f"weight shape {tuple(w.shape)} does not take inputs of size {in_f}")
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    biases = list(biases) if biases is not None else [None] * len(weights)
    if len(biases) != len(weights):
        raise ValueError(f"got {len(biases)} biases for {len(weights)} weights")
    x = x.reshape(-1, in_f).to(torch.float32)
    weights32 = [w.to(device=x.device, dtype=torch.float32) for w in weights]
    biases32 = [None if b is None else b.to(device=x.device, dtype=torch.float32) for b in biases]
    head = forward if forward is not None else (lambda y: y)

    x_mean = x.abs().mean(dim=0)
    w_mean = None
    if duo_scaling:
        cat = torch.cat(weights32, dim=0)
        grouped = cat.abs().unflatten(1, (num_groups(in_f, group_size), -1))
        w_mean = (grouped / (grouped.amax(dim=-1, keepdim=True) + 1e-6)).flatten(1).mean(dim=0)

    with torch.no_grad():
        reference = head(_linear_outputs(x, weights32, biases32)).to(torch.float32)
        best_err, best_ratio, best_scales = float("inf"), -1.0, None
        errors: list[float] = []
        for i in range(grid):
            ratio = i / grid
            s = x_mean.pow(ratio)
            if w_mean is not None:
                s = s / (w_mean.pow(1 - ratio) + 1e-4)
            s = s.clamp(min=1e-4)
            s = s / (s.max() * s.min()).sqrt()
            # (x / s) @ Q(W s)^T == x @ (Q(W s) / s)^T, and scaling W is cheaper than scaling x
            q_ws = [fake_quantize(w * s, bits, group_size, sym) / s for w in weights32]
            out = head(_linear_outputs(x, q_ws, biases32)).to(torch.float32)
            err = (reference - out).square().mean().item()
            errors.append(err)
            if err < best_err:
                best_err, best_ratio, best_scales = err, ratio, s
    if best_scales is None:
        raise DegenerateCalibration("the AWQ scale search found no finite error: the "
                                    "calibration activations contain NaN or Inf")
    return best_scales, best_ratio, errors


def awq_search_clip(
    x: Tensor,
    w: Tensor,
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    n_grid: int = 20,
    max_shrink: float = 0.5,
    n_sample_tokens: int = 512,
    chunk_out: int = 256,
) -> Tensor:
    """Per-group clip threshold ``max_val[out, n_groups]`` (float32) for ``w`` fed by ``x``."""
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    out_f, in_f = w.shape
    ng = num_groups(in_f, group_size)
    gs = in_f if group_size == -1 else group_size
    x = x.reshape(-1, in_f)
    x = x[:: max(1, x.shape[0] // n_sample_tokens)].to(device=w.device, dtype=torch.float32)
    xg = x.unflatten(1, (ng, gs)).transpose(0, 1)  # [groups, tokens, gs]
    n_steps = max(1, int(max_shrink * n_grid))
    best_all = []
    with torch.no_grad():
        for c1 in range(0, out_f, chunk_out):
            wc = w[c1:c1 + chunk_out].to(torch.float32)
            wg = wc.unflatten(1, (ng, gs))  # [c, groups, gs]
            org_max = wg.abs().amax(dim=-1)  # [c, groups]
            org_out = torch.bmm(xg, wg.permute(1, 2, 0))  # [groups, tokens, c]
            best = org_max.clone()
            min_err = torch.full_like(org_max, float("inf"))
            for i_s in range(n_steps):
                max_val = org_max * (1 - i_s / n_grid)
                clipped = torch.clamp(wg, -max_val.unsqueeze(-1), max_val.unsqueeze(-1))
                q = fake_quantize(clipped.flatten(1), bits, group_size, sym)
                q = q.unflatten(1, (ng, gs))
                cur_out = torch.bmm(xg, q.permute(1, 2, 0))
                err = (cur_out - org_out).square().mean(dim=1).T  # [c, groups]
                better = err < min_err
                min_err = torch.where(better, err, min_err)
                best = torch.where(better, max_val, best)
            best_all.append(best)
    return torch.cat(best_all, dim=0)


def apply_clip(w: Tensor, max_val: Tensor) -> Tensor:
    """Clamp each group of ``w[out, in]`` to ``[-max_val, max_val]``, ``max_val[out, groups]``."""
    if max_val.ndim != 2 or max_val.shape[0] != w.shape[0] or w.shape[1] % max_val.shape[1]:
        raise ValueError(
            f"max_val shape {tuple(max_val.shape)} does not fit weight shape {tuple(w.shape)}"
        )
    wg = w.unflatten(1, (max_val.shape[1], -1))
    m = max_val.to(device=w.device, dtype=w.dtype).unsqueeze(-1)
    return torch.clamp(wg, -m, m).flatten(1)


def fold_scales(
    prev_op_weight: Tensor,
    prev_op_bias: Tensor | None,
    next_weights: Sequence[Tensor],
    scales: Tensor,
    *,
    norm_offset: float = 0.0,
) -> tuple[Tensor, Tensor | None, list[Tensor]]:
    """Fold ``scales`` into a 1-D norm weight or the last rows of a 2-D linear; new tensors."""
    # norm_offset=1 serves Gemma-style norms that multiply by (1 + weight)
    n = scales.numel()
    s = scales.reshape(-1).to(device=prev_op_weight.device, dtype=torch.float32)
    for w in next_weights:
        if w.ndim != 2 or w.shape[1] != n:
            raise ValueError(f"next weight shape {tuple(w.shape)} does not take {n} inputs")
    if prev_op_weight.ndim == 1:
        if prev_op_weight.shape[0] != n:
            raise ValueError(f"norm weight of size {prev_op_weight.shape[0]} != {n} scales")
        pw = prev_op_weight.to(torch.float32)
        new_prev = ((pw + norm_offset) / s - norm_offset).to(prev_op_weight.dtype)
    elif prev_op_weight.ndim == 2:
        if prev_op_weight.shape[0] < n:
            raise ValueError(
                f"previous linear has {prev_op_weight.shape[0]} outputs, fewer than {n} scales"
            )
        pw = prev_op_weight.to(torch.float32).clone()
        pw[-n:] /= s.unsqueeze(1)
        new_prev = pw.to(prev_op_weight.dtype)
    else:
        raise ValueError(f"previous op weight must be 1-D or 2-D, got {prev_op_weight.ndim}-D")
    new_bias = None
    if prev_op_bias is not None:
        b = prev_op_bias.to(torch.float32).clone()
        b[-n:] /= s
        new_bias = b.to(prev_op_bias.dtype)
    new_next = [(w.to(torch.float32) * s.to(w.device)).to(w.dtype) for w in next_weights]
    return new_prev, new_bias, new_next
