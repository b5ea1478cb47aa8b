"""int4 packing and the compressed-tensors checkpoint layout, checked against the library itself."""

from __future__ import annotations

import json

import pytest
import torch
from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

from quantkit.quantize.numerics import dequantize, quantize_rtn
from quantkit.quantize.pack import (
    pack_int4,
    quantization_config,
    to_compressed_tensors_state,
    unpack_int4,
)


@pytest.mark.parametrize("shape", [(4, 64), (7, 40), (3, 13), (16, 8)])
def test_pack_matches_compressed_tensors(shape):
    torch.manual_seed(0)
    q = torch.randint(-8, 8, shape, dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (shape[0], -(-shape[1] // 8))
    assert torch.equal(packed, pack_to_int32(q, 4))
    assert torch.equal(unpack_int4(packed, shape[1]), q)
    assert torch.equal(unpack_from_int32(packed, 4, torch.Size(shape)), q)
    # the extremes exercise the sign bit of the top nibble
    edge = torch.tensor([[-8, 7, -1, 0, 7, -8, 3, 7]], dtype=torch.int8)
    assert torch.equal(pack_int4(edge), pack_to_int32(edge, 4))


def test_unpack_rejects_wrong_width():
    with pytest.raises(ValueError):
        unpack_int4(torch.zeros(2, 2, dtype=torch.int32), 30)


def _scheme(config: dict) -> QuantizationScheme:
    return QuantizationConfig.model_validate(config).config_groups["group_0"]


@pytest.mark.parametrize(("bits", "group_size", "sym"),
                         [(4, 32, True), (4, 32, False), (4, -1, True), (4, -1, False),
                          (8, 64, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_matches_packed_compressor(bits, group_size, sym, dtype):
    torch.manual_seed(1)
    w = (torch.randn(40, 128) * 0.02).to(dtype)
    q, scale, zero = quantize_rtn(w, bits, group_size, sym)
    ours = to_compressed_tensors_state("model.layers.0.mlp.up_proj", q, scale, zero, None,
                                       bits, group_size, sym)
    prefix = "model.layers.0.mlp.up_proj."
    local = {k.removeprefix(prefix): v for k, v in ours.items()}

    scheme = _scheme(quantization_config(bits, group_size, sym, False, ["lm_head"]))
    fake = dequantize(q, scale, zero, group_size).to(dtype)
    expected = {"weight_packed", "weight_scale", "weight_shape"}
    assert set(local) == expected | (set() if sym else {"weight_zero_point"})
    # the library re-quantizes the fake-quant weight; at 8 bits bf16 cannot hold (q - z) * s
    # exactly, so its own round trip drifts there while our direct packing of q does not
    if not (bits == 8 and dtype == torch.bfloat16):
        theirs = PackedQuantizationCompressor.compress(
            {"weight": fake, "weight_scale": scale, "weight_zero_point": zero}, scheme)
        assert set(local) == set(theirs)
        for k in theirs:
            assert local[k].dtype == theirs[k].dtype and torch.equal(local[k], theirs[k]), k

    decoded = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
    assert decoded.dtype == dtype and torch.equal(decoded, fake)


def test_state_rejects_permuted_g_idx_and_bad_range():
    q, scale, zero = quantize_rtn(torch.randn(8, 64), 4, 32, True)
    trivial = torch.arange(64, dtype=torch.int32) // 32
    state = to_compressed_tensors_state("", q, scale, zero, trivial, 4, 32, True)
    assert "weight_g_idx" not in state
    with pytest.raises(ValueError, match="g_idx"):
        to_compressed_tensors_state("", q, scale, zero, trivial.flip(0), 4, 32, True)
    with pytest.raises(ValueError, match="range"):
        to_compressed_tensors_state("", q * 2, scale, zero, None, 4, 32, True)


@pytest.mark.parametrize(("group_size", "sym", "act_order"),
                         [(128, True, False), (32, False, True), (-1, True, True)])
def test_quantization_config_loads(group_size, sym, act_order):
    from transformers import CompressedTensorsConfig

    cfg = quantization_config(4, group_size, sym, act_order, ["lm_head"])
    cfg = json.loads(json.dumps(cfg))
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == "pack-quantized"
    assert cfg["quantization_status"] == "compressed" and cfg["ignore"] == ["lm_head"]
    weights = cfg["config_groups"]["group_0"]["weights"]
    assert cfg["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert weights["num_bits"] == 4 and weights["type"] == "int" and weights["symmetric"] is sym
    assert weights["strategy"] == ("group" if group_size > 0 else "channel")
    assert weights["group_size"] == (group_size if group_size > 0 else None)
    assert weights.get("actorder") == ("weight" if act_order else None)

    loaded = CompressedTensorsConfig.from_dict({"quantization_config": cfg}).quantization_config
    assert loaded.format == "pack-quantized"
    assert loaded.config_groups["group_0"].weights.symmetric is sym


@pytest.mark.parametrize("sym", [
    True,
    # compressed-tensors 0.20.1 + transformers 5.x allocate an unpacked zero point on load and
    # reject the packed one that the library's own compressor writes (llm-compressor#1618)
    pytest.param(False, marks=pytest.mark.xfail(reason="upstream asym load bug", strict=False)),
])
def test_transformers_loads_checkpoint(tmp_path, sym):
    from _models import random_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    model = random_model(config, dtype=torch.bfloat16)
    state, expected = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            q, scale, zero = quantize_rtn(module.weight.data, 4, 32, sym)
            state |= to_compressed_tensors_state(name, q, scale, zero, None, 4, 32, sym)
            expected[name] = dequantize(q, scale, zero, 32)
    state |= {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[0] not in expected}
    save_file(state, tmp_path / "model.safetensors")
    qcfg = quantization_config(4, 32, sym, False, ["lm_head"])
    cfg = config.to_dict() | {"torch_dtype": "bfloat16", "quantization_config": qcfg}
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded(torch.tensor([[1, 2, 3]]))  # the first forward decompresses the weights
    modules = dict(loaded.named_modules())
    for name, weight in expected.items():
        assert torch.equal(modules[name].weight.data, weight), name
