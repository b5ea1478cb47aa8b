"""The bandwidth floor of one user's decode step: the weights a step reads (from the safetensors
headers, the input embedding's one row), the KV cache of the context (from config.json), the
card's published bandwidth, and the share of it a measured TPOT reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.loadtest.stats import RequestRecord
from quantkit.roofline import (
    bandwidth,
    kv_bytes_per_token,
    roofline,
    served_roofline,
    tensor_bytes,
    weight_bytes_read,
)


def test_the_card_names_its_bandwidth_most_specific_first():
    assert bandwidth("NVIDIA H100 80GB HBM3") == 3.35
    assert bandwidth("NVIDIA H100 PCIe") == 2.0
    assert bandwidth("NVIDIA H100 NVL") == 3.9
    assert bandwidth("NVIDIA H200") == 4.8
    assert bandwidth("NVIDIA GH200 480GB") == 4.9
    assert bandwidth("NVIDIA A100-SXM4-80GB") == 2.039
    assert bandwidth("NVIDIA L40S") == 0.864 and bandwidth("NVIDIA L4") == 0.3
    assert bandwidth("Some Future Card") is None


def test_weights_read_per_token_are_the_stored_tensors_less_the_unread_embedding(tiny_model):
    """Counted from the headers alone, against safetensors' own reading of the tensors."""
    from safetensors import safe_open

    config = json.loads((tiny_model / "config.json").read_text())
    stored = {}
    for shard in tiny_model.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                t = f.get_tensor(name)
                stored[name] = t.numel() * t.element_size()
    assert tensor_bytes(tiny_model) == stored
    embed = next(v for k, v in stored.items() if k.endswith("embed_tokens.weight"))
    read = weight_bytes_read(tiny_model, {**config, "tie_word_embeddings": False})
    assert read == sum(stored.values()) - embed + embed // config["vocab_size"]
    assert weight_bytes_read(tiny_model, {**config, "tie_word_embeddings": True}) == sum(
        stored.values())
    assert weight_bytes_read(tiny_model.parent, config) is None  # no safetensors there


def test_the_kv_cache_per_token_is_every_layers_keys_and_values():
    llama8b = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096}
    assert kv_bytes_per_token(llama8b, 2) == 2 * 32 * 8 * 128 * 2 == 131072  # 128 KiB a token
    assert kv_bytes_per_token(llama8b, 1) == 65536  # the FP8 cache: half
    assert kv_bytes_per_token({"text_config": llama8b}, 2) == 131072
    assert kv_bytes_per_token({"kv_lora_rank": 512}, 2) is None


def test_a_measured_tpot_is_a_share_of_the_floor(tiny_model, tmp_path):
    config = json.loads((tiny_model / "config.json").read_text())
    line = roofline(tiny_model, "NVIDIA H100 80GB HBM3", 1000, 0.002)
    assert line is not None
    weights = weight_bytes_read(tiny_model, config)
    assert weights is not None
    dtype = config.get("torch_dtype") or config.get("dtype")
    kv = kv_bytes_per_token(config, 4 if dtype == "float32" else 2)
    assert kv is not None
    assert line.weight_bytes == weights and line.kv_bytes == kv * 1000
    assert line.floor_s == pytest.approx((weights + kv * 1000) / 3.35e12, rel=1e-3)
    assert line.share == pytest.approx(line.floor_s / 0.002, rel=1e-3)
    fp8 = roofline(tiny_model, "NVIDIA H100 80GB HBM3", 1000, 0.002, "fp8_e4m3")
    assert fp8 is not None and fp8.kv_bytes < line.kv_bytes
    assert "% of the bandwidth" in line.sentence() and "3.35 TB/s" in line.sentence()
    assert roofline(tiny_model, "Some Future Card", 1000, 0.002) is None
    assert roofline(tmp_path, "NVIDIA H200", 1000, 0.002) is None  # no config.json


def test_bench_takes_the_served_folder_and_the_context_its_requests_averaged(tiny_model):
    """quantkit serve's card names the artifact; the context is the prompt and half the output,
    averaged over the requests that completed; one user's TPOT p50 is the measured time."""
    card = {"id": "m", "quantkit": {"artifact": str(tiny_model), "kv_cache_dtype": "auto"}}
    records = [RequestRecord("short", prompt_tokens=100, output_tokens=64),
               RequestRecord("long", prompt_tokens=900, output_tokens=128),
               RequestRecord("long", error="timeout", prompt_tokens=5000)]
    levels = [{"concurrency": 1, "tpot_s": {"p50": 0.004}},
              {"concurrency": 8, "tpot_s": {"p50": 0.009}}]
    line = served_roofline(card, records, levels, "NVIDIA H200")
    assert line is not None
    assert line.context == round((100 + 32 + 900 + 64) / 2) and line.tpot_s == 0.004
    assert served_roofline(card, records, levels[1:], "NVIDIA H200") is None  # no one-user level
    assert served_roofline(card, records, levels, None) is None  # no GPU here
    assert served_roofline({"id": "m"}, records, levels, "NVIDIA H200") is None  # not ours
    gguf = {"quantkit": {"artifact": str(Path(tiny_model) / "model.gguf")}}
    assert served_roofline(gguf, records, levels, "NVIDIA H200") is None  # a file, not a folder


def test_bench_prints_and_reports_the_roofline(tiny_model):
    from quantkit.loadtest.report import render_bench_report
    from quantkit.views import benched

    line = roofline(tiny_model, "NVIDIA H200", 500, 0.003)
    assert line is not None
    res = {"levels": [], "knee": {"concurrency": 1, "reason": "r"}, "recommended_concurrency": 1,
           "roofline": line.to_dict()}
    assert line.sentence() in benched(res, Path("out"))
    assert "roofline at 1 user" in render_bench_report(res)
    assert "roofline" not in benched({**res, "roofline": None}, Path("out"))
