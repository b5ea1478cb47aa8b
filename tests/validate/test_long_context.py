"""The long-context task: documents at shares of the context with facts planted at depths, the
demo model retrieving them, and a broken FP8 KV cache failing its gate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from quantkit.validate.longctx import DEPTHS, SHARES, build_items, filler


def test_documents_reach_the_context_with_facts_at_their_depths(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    texts = filler(None)
    items = build_items(encode, 1024, texts, 9, seed=3)
    assert items == build_items(encode, 1024, texts, 9, seed=3)  # both models get the same
    assert [it["depth"] for it in items] == [d for d in DEPTHS for _ in SHARES]
    for it, share in zip(items, SHARES * 3):
        assert 0.9 * share * 1024 <= it["length"] <= share * 1024 + 8
        text = tok.decode(it["ids"])
        code = tok.decode(it["answer"]).strip()
        asked = text.rsplit("access code of the ", 1)[1].split(" is")[0]
        fact = f"The access code of the {asked} is {code}."
        # the three facts and the answer's start
        assert text.count(fact) == 1 and text.count("The access code of the") == 3 + 1
        where = text.index(fact) / len(text.split("\n\nQuestion:")[0])
        assert abs(where - it["depth"]) < 0.1


@pytest.mark.slow  # the demo model through quantize (FP8, FP8 KV cache) and three validations
@pytest.mark.e2e
def test_a_broken_fp8_kv_cache_fails_the_long_context_gate(cli, tmp_path):
    """FP8 weights, activations and KV cache keep the probability the demo model gives the
    planted facts; the same artifact with key scales 64x too small (keys clipped in the cache)
    loses it, and the gate says so."""
    art, calib = tmp_path / "fp8-kv", tmp_path / "calib"
    code, _, err = cli("calibrate", "smollm2-135m", "--source", "builtin:stdlib-docs", "--samples",
                       "16", "--min-tokens", "256", "--max-tokens", "512", "--out", str(calib))
    assert code == 0, err
    code, _, err = cli("quantize", "smollm2-135m", "--method", "fp8", "--kv-cache", "fp8",
                       "--calib", str(calib), "--out", str(art))
    assert code == 0, err
    gate = tmp_path / "t.yaml"
    gate.write_text("long_context: {retention: 0.75}\n")

    def validate(artifact: Path, out: Path) -> tuple[int, dict]:
        code, _, err = cli("validate", str(artifact), "--baseline", "smollm2-135m", "--tasks",
                           "long_context",
                           "--long-context-samples", "3", "--thresholds", str(gate),
                           "--out", str(out))
        assert (out / "results.json").is_file(), err
        return code, json.loads((out / "results.json").read_text())["tasks"]["long_context"]

    code, good = validate(art, tmp_path / "good")
    assert good["kv_cache"] == "fp8" and good["baseline"]["accuracy"] >= 2 / 3
    assert code == 0 and good["retention"]["value"] >= 0.75
    broken = tmp_path / "broken"
    shutil.copytree(art, broken)
    for f in broken.glob("model-layer-*.safetensors"):
        t = load_file(str(f))
        t.update({k: v / 64 for k, v in t.items() if k.endswith("k_scale")})
        save_file(t, str(f), metadata={"format": "pt"})
    code, bad = validate(broken, tmp_path / "bad")
    assert code == 1 and bad["retention"]["value"] < 0.1
    assert bad["quantized"]["mean_logprob"] < good["quantized"]["mean_logprob"] - 10
    assert bad["quantized"]["accuracy"] == 0
