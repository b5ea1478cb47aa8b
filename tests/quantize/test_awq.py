"""AWQ scale/clip search on inputs with a few large-magnitude outlier channels."""

from __future__ import annotations

import pytest
import torch

from quantkit.quantize.awq import apply_clip, awq_search_clip, awq_search_scale, fold_scales
from quantkit.quantize.numerics import fake_quantize

IN, HID, N, GS = 128, 96, 256, 32


def _mlp() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs with outlier channels, and gate/up/down weights of a small MLP."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, IN, generator=g)
    x[:, [3, 40, 77, 100]] *= 30  # salient channels, as after an RMSNorm in a real LLM
    gate = torch.randn(HID, IN, generator=g) * 0.05
    up = torch.randn(HID, IN, generator=g) * 0.05
    down = torch.randn(IN, HID, generator=g) * 0.05
    return x, gate, up, down


def _err(x: torch.Tensor, weights: list[torch.Tensor], qweights: list[torch.Tensor]) -> float:
    ref = torch.cat([x @ w.T for w in weights], dim=1)
    return (ref - torch.cat([x @ q.T for q in qweights], dim=1)).square().mean().item()


@pytest.mark.parametrize("sym", [True, False])
def test_scale_and_clip_beat_rtn(sym):
    x, gate, up, _ = _mlp()
    weights = [gate, up]
    rtn = _err(x, weights, [fake_quantize(w, 4, GS, sym) for w in weights])

    scales, ratio, errors = awq_search_scale(x, weights, bits=4, group_size=GS, sym=sym, grid=10)
    assert scales.shape == (IN,) and len(errors) == 10 and 0 < ratio < 1
    assert errors[0] == pytest.approx(rtn, rel=1e-4)  # ratio 0 is plain RTN
    assert min(errors) == errors[int(round(ratio * 10))]

    qweights = []
    for w in weights:
        ws = w * scales
        max_val = awq_search_clip(x / scales, ws, bits=4, group_size=GS, sym=sym, n_grid=10)
        assert max_val.shape == (HID, IN // GS)
        assert (max_val <= ws.unflatten(1, (-1, GS)).abs().amax(-1)).all()
        qweights.append(fake_quantize(apply_clip(ws, max_val), 4, GS, sym) / scales)
    awq = _err(x, weights, qweights)
    assert awq < 0.9 * rtn, (awq, rtn)
    assert awq < min(errors)  # clipping helps on top of scaling


def test_scale_search_through_forward():
    x, gate, up, down = _mlp()

    def mlp_tail(y: torch.Tensor) -> torch.Tensor:
        g, u = y.split(HID, dim=1)
        return (torch.nn.functional.silu(g) * u) @ down.T

    scales, ratio, errors = awq_search_scale(x, [gate, up], mlp_tail, group_size=GS, grid=8,
                                             duo_scaling=True)
    assert min(errors) < 0.9 * errors[0]
    assert torch.isfinite(scales).all() and (scales > 0).all()


def test_apply_clip_bounds_groups():
    w = torch.randn(4, 64)
    max_val = torch.full((4, 2), 0.5)
    max_val[:, 1] = 0.1
    clipped = apply_clip(w, max_val)
    assert clipped[:, :32].abs().max() <= 0.5 and clipped[:, 32:].abs().max() <= 0.1
    with pytest.raises(ValueError):
        apply_clip(w, torch.ones(4, 3))


def test_fold_scales_preserves_function():
    g = torch.Generator().manual_seed(1)
    s = torch.rand(IN, generator=g) + 0.5
    x = torch.randn(8, IN, generator=g)
    # into an RMSNorm weight (and a Gemma-style (1 + w) one) feeding two linears
    norm = torch.randn(IN, generator=g)
    nxt = [torch.randn(16, IN, generator=g), torch.randn(24, IN, generator=g)]
    for offset in (0.0, 1.0):
        new_norm, _, new_next = fold_scales(norm, None, nxt, s, norm_offset=offset)
        for w, nw in zip(nxt, new_next):
            ref = (x * (norm + offset)) @ w.T
            assert torch.allclose((x * (new_norm + offset)) @ nw.T, ref, atol=1e-4)
    # into a preceding linear with bias (v_proj -> o_proj)
    v_w, v_b = torch.randn(IN, 32, generator=g), torch.randn(IN, generator=g)
    o_w = torch.randn(32, IN, generator=g)
    h = torch.randn(8, 32, generator=g)
    new_v, new_b, (new_o,) = fold_scales(v_w, v_b, [o_w], s)
    assert torch.allclose((h @ new_v.T + new_b) @ new_o.T, (h @ v_w.T + v_b) @ o_w.T, atol=1e-3)
    with pytest.raises(ValueError):
        fold_scales(torch.randn(IN + 1), None, nxt, s)
