"""Tiny random-weight models of the architectures a user brings, built from a config with
transformers' own classes (the architecture tests and bench/arch_table.py, bench/h200/ use them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

COMMON = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=None,
              tie_word_embeddings=False)
DENSE = ["llama", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "granite", "olmo2"]
MOE = {"mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
       "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                     "shared_expert_intermediate_size": 128},
       "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64},
       "olmoe": {"num_experts": 4, "num_experts_per_tok": 2}}


def build(kind: str, tokenizer_from: Path, out: Path, **extra: object) -> Path:
    """A tiny random-weight model of `kind` with the tiny llama's tokenizer, on disk."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.for_model(kind, **{**COMMON, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # weights large enough that the outputs are far from uniform
        for p in model.parameters():
            if p.ndim >= 2:  # linears, routers; fused experts larger, so that each matters
                p.normal_(0, 0.08 if p.ndim == 2 else 0.2)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
    return out


TIED = {"gemma2", "gemma3_text"}  # Gemma ties its output head to the embeddings (vLLM requires it)


def kl(path_a: Path, path_b: Path, samples: list[list[int]]) -> float:
    """Mean per-token KL(a || b) over the samples, through transformers' own forward."""
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(path_a, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(path_b, dtype=torch.float32).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s])
            la, lb = a(ids).logits.log_softmax(-1), b(ids).logits.log_softmax(-1)
            total += float((la.exp() * (la - lb)).sum())
            n += len(s)
    return total / n




def quantize_both(kind: str, path: Path, calib: Path, tmp_path_factory: Any) -> dict[str, Path]:
    """The model's GPTQ and AWQ (W4 g32) artifacts, made once for a module's tests."""
    from quantkit.config import QuantizeConfig
    from quantkit.quantize import quantize

    out = {}
    for method in ("gptq", "awq"):
        out[method] = tmp_path_factory.mktemp(f"{kind}-{method}") / "artifact"
        manifest = quantize(model=str(path), calib=calib, out=out[method],
                            cfg=QuantizeConfig(method=method, group_size=32))
        assert set(manifest.layer_errors) == {"0", "1"}
    return out
