"""GPTQ on one linear layer with correlated calibration inputs."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import DegenerateCalibration
from quantkit.quantize.gptq import accumulate_hessian, gptq_quantize_weight
from quantkit.quantize.numerics import dequantize, fake_quantize

IN, OUT, N = 128, 64, 512


def _layer() -> tuple[torch.Tensor, torch.Tensor]:
    """A random weight and inputs with correlated, unevenly scaled channels (a non-trivial H)."""
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(IN, IN, generator=g) / IN**0.5
    x = torch.randn(N, IN, generator=g) @ mix * (torch.rand(IN, generator=g) * 3 + 0.2)
    w = torch.randn(OUT, IN, generator=g) * 0.05
    return w, x


def _hessian(x: torch.Tensor) -> torch.Tensor:
    H, n = None, 0
    for chunk in x.reshape(4, -1, IN):  # batches of [tokens, in], as a forward hook sees them
        H, n = accumulate_hessian(H, chunk.unsqueeze(0), n)
    assert n == N
    return H


def _out_err(x: torch.Tensor, w: torch.Tensor, wq: torch.Tensor) -> float:
    return torch.linalg.norm(x @ w.T - x @ wq.T).item()


def test_accumulate_hessian_is_running_mean():
    _, x = _layer()
    assert torch.allclose(_hessian(x), 2 / N * x.T @ x, rtol=1e-4, atol=1e-5)
    H, n = accumulate_hessian(torch.ones(IN, IN), x[:0], 7)
    assert n == 7 and torch.equal(H, torch.ones(IN, IN))


CASES = [(32, True, False, True), (32, False, False, True), (32, True, True, True),
         (32, False, True, True), (32, True, True, False), (32, False, True, False),
         (-1, True, False, True), (-1, False, True, True)]


@pytest.mark.parametrize(("group_size", "sym", "act_order", "static_groups"), CASES)
def test_gptq_beats_rtn(group_size, sym, act_order, static_groups):
    w, x = _layer()
    res = gptq_quantize_weight(w, _hessian(x), bits=4, group_size=group_size, sym=sym,
                               act_order=act_order, static_groups=static_groups, block_size=64)
    rtn = _out_err(x, w, fake_quantize(w, 4, group_size, sym))
    gptq = _out_err(x, w, res.weight)
    assert gptq < 0.9 * rtn, (gptq, rtn)
    assert res.loss > 0

    assert res.q_int.dtype == torch.int8 and res.q_int.shape == (OUT, IN)
    assert -8 <= res.q_int.min() and res.q_int.max() <= 7
    assert res.scale.shape == res.zero.shape == (OUT, IN // group_size if group_size > 0 else 1)
    if sym:
        assert not res.zero.any()
    # the stored ints, scales and zero points decode (through g_idx if any) to the returned weight
    decoded = dequantize(res.q_int, res.scale, res.zero, group_size, res.g_idx)
    assert torch.equal(decoded, res.weight)
    dynamic_act_order = act_order and not static_groups and group_size > 0
    assert (res.g_idx is not None) == dynamic_act_order
    if dynamic_act_order:
        assert res.g_idx.dtype == torch.int32 and res.g_idx.shape == (IN,)
        assert torch.equal(torch.bincount(res.g_idx), torch.full((IN // group_size,), group_size))
        assert not torch.equal(res.g_idx.long(), torch.arange(IN) // group_size)


@pytest.mark.parametrize("act_order", [False, True])
def test_mse_clipping_lowers_the_output_error(act_order):
    w, x = _layer()
    w[:, ::16] *= 5  # outlier columns: min/max ranges waste most of the grid on them
    H = _hessian(x)
    kw = {"bits": 4, "group_size": 32, "act_order": act_order, "block_size": 64}
    minmax = gptq_quantize_weight(w, H, **kw)
    mse = gptq_quantize_weight(w, H, clip="mse", **kw)
    assert _out_err(x, w, mse.weight) < _out_err(x, w, minmax.weight)


def test_bf16_weight_scales_in_model_dtype():
    w, x = _layer()
    w = w.to(torch.bfloat16)
    res = gptq_quantize_weight(w, _hessian(x), group_size=32, sym=False, act_order=True)
    assert res.weight.dtype == res.scale.dtype == torch.bfloat16
    assert torch.equal(dequantize(res.q_int, res.scale, res.zero, 32), res.weight)
    rtn = _out_err(x, w.float(), fake_quantize(w, 4, 32, False).float())
    assert _out_err(x, w.float(), res.weight.float()) < 0.9 * rtn


def test_dead_columns_and_damping_fallback():
    w, x = _layer()
    x[:, 5] = 0
    H = _hessian(x)
    res = gptq_quantize_weight(w, H, group_size=32)
    assert torch.equal(res.weight[:, 5], torch.zeros(OUT))
    # positive diagonal but indefinite: Cholesky only succeeds once damping passes 0.5
    indefinite = torch.block_diag(*[torch.tensor([[1.0, 1.5], [1.5, 1.0]])] * (IN // 2))
    res = gptq_quantize_weight(w, indefinite, group_size=32, damp=0.01)
    assert torch.isfinite(res.weight).all()
    # degenerate calibration is the user's input: BadInput (exit 2), not a crash
    with pytest.raises(DegenerateCalibration, match="positive definite") as exc:
        gptq_quantize_weight(w, -torch.eye(IN), group_size=32)
    assert exc.value.exit_code == 2 and "calibrate" in exc.value.hint
    nan = _hessian(x)
    nan[0, 0] = float("nan")
    with pytest.raises(DegenerateCalibration, match="NaN or Inf"):
        gptq_quantize_weight(w, nan, group_size=32)


def test_bad_shapes_raise():
    w, x = _layer()
    with pytest.raises(ValueError, match="128.*48|48.*128"):
        gptq_quantize_weight(w, _hessian(x), group_size=48)
    with pytest.raises(ValueError, match="Hessian"):
        gptq_quantize_weight(w, torch.eye(IN + 1), group_size=32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kw", [{"group_size": 32, "act_order": True}, {"group_size": -1}],
                         ids=["act-order-static-groups", "per-channel"])
def test_cuda_graph_sweep_gives_the_eager_result(kw, monkeypatch):
    """The graphed block sweep (whole blocks whose scales are fixed before the sweep: static
    groups with act-order, per-channel scales) runs the eager kernels: the same integers, scales
    and loss, and a last block narrower than the others (in_features % block_size) works too."""
    from quantkit.quantize import gptq

    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2048, 320, generator=g) * (torch.rand(320, generator=g) + 0.1)).cuda()
    w = (torch.randn(96, 320, generator=g) * 0.05).cuda()
    H, _ = accumulate_hessian(None, x, 0)
    kw = {**kw, "block_size": 128}
    monkeypatch.setattr(gptq, "_GRAPHS", {})
    graphed = gptq_quantize_weight(w, H, **kw)
    assert sorted(k[0] for k, v in gptq._GRAPHS.items() if v is not None) == [(96, 64), (96, 128)]
    monkeypatch.setattr(gptq, "USE_CUDA_GRAPHS", False)
    eager = gptq_quantize_weight(w, H, **kw)
    assert torch.equal(graphed.q_int, eager.q_int) and torch.equal(graphed.scale, eager.scale)
    assert graphed.loss == eager.loss
