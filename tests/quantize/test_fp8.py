"""FP8 W8A8 (`--method fp8`, dynamic and `--static`) and W4A8 (`--activations fp8`): the
checkpoint transformers loads computes what vLLM computes, checked against an emulation written
from vLLM's kernels' definitions (FP8 values, per-row weight scales, per-token or per-tensor input
scales, W4A8's FP8 group scales)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _models import build
from safetensors.torch import load_file

from quantkit.config import QuantizeConfig, parse_candidate
from quantkit.fp8 import (
    FP8,
    fake_fp8_tensor,
    fake_fp8_tokens,
    to_fp8,
    vllm_w4a8_scales,
    w4a8_grid,
)
from quantkit.quantize import quantize
from quantkit.quantize.numerics import dequantize
from quantkit.quantize.pack import unpack_int4

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def wide(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama whose fused linears are multiples of 128 (vLLM's W4A8 kernel needs it)."""
    return build("llama", tiny_model, tmp_path_factory.mktemp("wide") / "m", hidden_size=128,
                 intermediate_size=256, head_dim=32)


@pytest.fixture(scope="module")
def artifacts(wide: Path, tiny_calib: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fp8")
    made = {}
    for name, cfg in (("fp8", QuantizeConfig(method="fp8")),
                      ("fp8-static", QuantizeConfig(method="fp8", static=True)),
                      ("w4a8-gptq", QuantizeConfig(method="gptq", activations="fp8")),
                      ("w4a8-awq", QuantizeConfig(method="awq", activations="fp8,memory"))):
        quantize(model=str(wide), cfg=cfg, calib=tiny_calib, out=base / name)
        made[name] = base / name
    return made


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _emulated(source: Path, artifact: Path) -> Any:
    """The source model with each linear's weights decoded from the artifact by hand and its
    inputs quantized as vLLM's FP8 kernels quantize them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    t = _tensors(artifact)
    qc = json.loads((artifact / "config.json").read_text())["quantization_config"]
    scheme = qc["config_groups"]["group_0"]
    # the 16-bit tensors as the artifact holds them (AWQ folds its scales into the norms)
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in t.items() if k in own and v.dtype != FP8}, strict=False)
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] not in LINEARS:
            continue
        if f"{name}.weight_packed" in t:
            q = unpack_int4(t[f"{name}.weight_packed"], mod.in_features)
            w = dequantize(q, t[f"{name}.weight_scale"].float(), None,
                           scheme["weights"]["group_size"])
        else:
            assert t[f"{name}.weight"].dtype == FP8
            w = t[f"{name}.weight"].float() * t[f"{name}.weight_scale"].float()
        mod.weight.data.copy_(w)
        if f"{name}.input_scale" in t:
            scale = t[f"{name}.input_scale"]
            mod.register_forward_pre_hook(lambda _m, a, s=scale: (fake_fp8_tensor(a[0], s),))
        else:
            mod.register_forward_pre_hook(lambda _m, a: (fake_fp8_tokens(a[0]),))
    return model


@pytest.mark.parametrize("name", ["fp8", "fp8-static", "w4a8-gptq", "w4a8-awq"])
def test_transformers_computes_what_vllm_computes(name, artifacts, wide, fp_model):
    """transformers (compressed-tensors' CPU fake quantization, what `quantkit validate` runs)
    gives the logits of the hand emulation of vLLM's kernels, and they differ from the source."""
    art = artifacts[name]
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (2, 48))
    with torch.no_grad():
        loaded = fp_model(art)(ids).logits
        emulated = _emulated(wide, art)(ids).logits
        source = fp_model(wide)(ids).logits
    assert torch.allclose(loaded, emulated, atol=2e-4, rtol=0), (loaded - emulated).abs().max()
    assert (loaded - source).abs().max() > 1e-3


def test_checkpoint_layout_and_manifest(artifacts):
    for name, art in artifacts.items():
        qc = json.loads((art / "config.json").read_text())["quantization_config"]
        group = qc["config_groups"]["group_0"]
        acts = group["input_activations"]
        manifest = json.loads((art / "quantkit.json").read_text())
        t = _tensors(art)
        assert acts["type"] == "float" and acts["num_bits"] == 8
        if name.startswith("fp8"):
            assert qc["format"] == "float-quantized" == manifest["format"]
            assert group["weights"] == {**group["weights"], "type": "float", "num_bits": 8,
                                        "strategy": "channel"}
            assert t["model.layers.0.mlp.down_proj.weight"].dtype == FP8
            assert t["model.layers.0.mlp.down_proj.weight_scale"].shape == (128, 1)
            static = name == "fp8-static"
            assert acts["strategy"] == ("tensor" if static else "token")
            assert acts["dynamic"] is not static
            assert ("model.layers.1.self_attn.q_proj.input_scale" in t) is static
            assert 8.0 < manifest["linear_bits_per_weight"] < 8.5
        else:
            assert qc["format"] == "pack-quantized" == manifest["format"]
            assert group["weights"]["group_size"] == 128 and group["weights"]["num_bits"] == 4
            assert acts["strategy"] == "token" and acts["dynamic"] is True
        assert manifest["parameters"]["act_fp8"] == ("static" if name == "fp8-static"
                                                     else "dynamic")
        # what the model keeps in 16 bits stays out of the scheme
        assert "lm_head" in qc["ignore"]


def test_static_input_scale_is_the_calibration_maximum(artifacts, wide, tiny_calib, fp_model):
    """FP8-static: each linear's input scale is max |x| over the calibration set / 448 (q, k and
    v share one, as vLLM's fused qkv needs); layer 0's inputs are the source's own."""
    from quantkit.calib import load_calibration_set
    from quantkit.quantize.layers import linear

    t = _tensors(artifacts["fp8-static"])
    scales = [t[f"model.layers.0.self_attn.{p}.input_scale"] for p in ("q_proj", "k_proj",
                                                                      "v_proj")]
    assert scales[0].shape == (1,) and all(torch.equal(scales[0], s) for s in scales)
    model = fp_model(wide)
    seen: list[float] = []
    layer = model.model.layers[0]
    linear(layer, "self_attn.q_proj").register_forward_pre_hook(
        lambda _m, a: seen.append(float(a[0].abs().max())))
    with torch.no_grad():
        for ids in load_calibration_set(tiny_calib).input_ids:
            model(torch.tensor([ids]))
    assert scales[0].item() == pytest.approx(max(seen) / 448, rel=1e-5)


def test_w4a8_scales_are_what_vllm_keeps(artifacts):
    """W4A8's stored group scales survive vLLM's conversion to FP8 x a per-row scale (up to the
    file dtype's rounding), so transformers and vLLM decode the same weights."""
    for name in ("w4a8-gptq", "w4a8-awq"):
        t = _tensors(artifacts[name])
        for key, scale in t.items():
            if key.endswith("weight_scale"):
                assert torch.allclose(vllm_w4a8_scales(scale), scale.float(), rtol=2**-8,
                                      atol=0), key
                assert torch.equal(w4a8_grid(scale), scale), key


def test_w4a8_grid_is_a_fixed_point_of_vllms_conversion():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        s = (torch.rand(64, 32) * 0.02 + 1e-3).to(dtype)
        s[3, 5] = 0.5  # one large group in a row
        snapped = w4a8_grid(s)
        assert snapped.dtype == dtype and torch.equal(w4a8_grid(snapped), snapped)
        rounding = {torch.bfloat16: 2**-8, torch.float16: 2**-10, torch.float32: 2**-20}[dtype]
        assert torch.allclose(vllm_w4a8_scales(snapped), snapped.float(), rtol=rounding, atol=0)
        # each group moves by FP8's rounding (4 significant bits), a row's largest not at all
        assert ((snapped.float() / s.float() - 1).abs() <= 2**-4 + rounding).all()
        top = s.float().argmax(dim=1, keepdim=True)
        assert torch.equal(snapped.gather(1, top), s.gather(1, top))
    # vLLM's own conversion of unsnapped scales moves them: what the snapping spares
    raw = (torch.rand(64, 32) * 0.02 + 1e-3).bfloat16()
    assert (vllm_w4a8_scales(raw) / raw.float() - 1).abs().max() > 2**-6


def test_fp8_rounding_saturates_like_vllm():
    x = torch.tensor([0.0, 1.0, 1.0625, 500.0, -1e6, 0.001])  # ties to even; 0.001 -> 2**-9
    got = to_fp8(x).float()
    assert got.tolist() == [0.0, 1.0, 1.0, 448.0, -448.0, 2.0**-9]
    rows = torch.randn(4, 64) * torch.tensor([[1e-3], [1.0], [30.0], [0.0]])
    fake = fake_fp8_tokens(rows)
    assert torch.isfinite(fake).all() and fake[3].abs().max() == 0
    assert ((fake - rows).abs() <= rows.abs() * 0.0625 + 1e-9).all()


def test_candidates_name_the_new_formats():
    assert parse_candidate("gptq", "W4A8g128") == {"method": "gptq", "bits": 4, "group_size": 128,
                                                   "w8_groups": "", "activations": "fp8"}
    assert parse_candidate("gptq", "FP8")["method"] == "fp8"
    assert parse_candidate("fp8", "FP8-static") == {"method": "fp8", "static": True,
                                                    "group_size": -1}
    for bad in ("W8A8g128", "W4A8g32+10%", "FP9"):
        with pytest.raises(Exception, match="unknown"):
            parse_candidate("gptq", bad)


def test_resume_decodes_fp8_layers(artifacts, wide, fp_model):
    """What a resumed run restores of a finished FP8 layer: the E4M3 weights times their scales
    (not the raw FP8 values), and the layer's other tensors as they were."""
    from quantkit.quantize.checkpoint import load_layer
    from quantkit.quantize.families import LLAMA_LIKE
    from quantkit.quantize.layers import QuantSpec

    art = artifacts["fp8-static"]
    spec = QuantSpec.from_config(QuantizeConfig(method="fp8", static=True))
    model = fp_model(wide)
    layer = model.model.layers[1]
    norm = layer.input_layernorm.weight.clone()
    load_layer(art, 1, "model.layers", layer, LLAMA_LIKE, spec)
    t = _tensors(art)
    key = "model.layers.1.mlp.up_proj"
    assert torch.equal(layer.mlp.up_proj.weight,
                       t[f"{key}.weight"].float() * t[f"{key}.weight_scale"].float())
    assert torch.equal(layer.input_layernorm.weight, norm)


def test_auto_plans_fp8_candidates_and_skips_what_the_kernels_cannot_take(
        tiny_model, tiny_calib, tmp_path):
    """`quantkit auto` takes FP8 and W4A8 candidates by name; one whose fused linears miss the
    W4A8 kernel's 128-tile is skipped with the reason, as a group size that does not divide is."""
    from quantkit.auto import plan
    from quantkit.config import AutoConfig

    narrow = build("llama", tiny_model, tmp_path / "m", hidden_size=128, intermediate_size=256,
                   head_dim=32, num_key_value_heads=1)  # q/k/v fused: 128 + 32 + 32 rows
    out, skipped, _ = plan(str(narrow), tiny_calib,
                           AutoConfig(candidates=("W4A8g128", "FP8-static", "W8")),
                           QuantizeConfig())
    assert [n for n, _ in out] == ["FP8-static", "W8"]
    assert skipped[0].startswith("W4A8g128") and "192 x 128" in skipped[0]
    fp8 = dict(out)["FP8-static"]
    assert fp8.method == "fp8" and fp8.static and fp8.activation_format == "fp8"
