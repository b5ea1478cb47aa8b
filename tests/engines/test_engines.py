"""The engines that validation (and serving) score and generate with."""

from __future__ import annotations

import math
import shutil

import pytest


@pytest.fixture(scope="module")
def hf(tiny_model):
    from quantkit.engines import engine_for

    return engine_for(tiny_model, threads=1, engine="transformers")


def test_loglikelihood_agrees_with_token_nlls(hf):
    ctx, cont = hf.encode("def add(a, b):\n"), hf.encode("    return a + b\n")
    (ll, _), = hf.loglikelihood([(ctx, cont)])
    nlls = hf.token_nlls(ctx + cont)
    assert len(nlls) == len(ctx + cont) - 1
    assert math.isclose(-ll, sum(nlls[-len(cont):]), rel_tol=1e-4)


def test_shared_context_requests_match_separate_ones(hf):
    ctx = hf.encode("import os\nimport sys\n")
    conts = [hf.encode(" A"), hf.encode(" B"), hf.encode("import json")]
    together = hf.loglikelihood([(ctx, c) for c in conts])
    alone = [hf.loglikelihood([(ctx, c)])[0] for c in conts]
    for (a, ga), (b, gb) in zip(together, alone):
        assert math.isclose(a, b, rel_tol=1e-4) and ga == gb


def test_greedy_flag_is_the_argmax(hf):
    ctx = hf.encode("for i in range(")
    best = hf.generate("for i in range(", max_tokens=1).token_ids
    (_, greedy), = hf.loglikelihood([(ctx, best)])
    assert greedy


def test_sampling_is_seeded_and_batches_like_single_calls(hf):
    prompts = [hf.chat_prompt("Write a poem"), hf.chat_prompt("Explain lists")]
    a = hf.generate_many(prompts, max_tokens=12, temperature=0.9, top_p=0.9, seed=3)
    b = hf.generate_many(prompts, max_tokens=12, temperature=0.9, top_p=0.9, seed=3)
    assert [g.text for g in a] == [g.text for g in b]
    assert all(g.finish_reason in ("eos", "length") for g in a)
    greedy_batch = hf.generate_many(prompts, max_tokens=8)
    greedy_one = [hf.generate(p, max_tokens=8) for p in prompts]
    assert [g.token_ids for g in greedy_batch] == [g.token_ids for g in greedy_one]


def test_stop_strings_cut_the_text(hf):
    g = hf.generate("def f():\n", max_tokens=40, stop=["\n"])
    assert "\n" not in g.text


def test_the_cpu_computes_a_float32_model_in_float32_and_a_16_bit_one_in_its_match(
        tiny_model, tmp_path, monkeypatch):
    """On the CPU a float32 model runs in float32, a bfloat16 one in bfloat16 where the CPU
    multiplies it in hardware (AMX or AVX512-BF16, read from /proc/cpuinfo), else in float32,
    or in $QUANTKIT_CPU_DTYPE; the engine registry's `dtype` says the same before any load
    (validation's record and the key of its baseline cache)."""
    import torch
    from _models import native_bf16_cpu

    from quantkit.engines.choice import ENGINES
    from quantkit.engines.hf import TransformersEngine
    from quantkit.models import load_model

    native = native_bf16_cpu()
    bf16 = tmp_path / "bf16"
    load_model(tiny_model).to(torch.bfloat16).save_pretrained(bf16)
    for f in tiny_model.iterdir():
        if f.suffix != ".safetensors" and not (bf16 / f.name).exists():
            shutil.copy(f, bf16 / f.name)
    for path, want, env in ((tiny_model, "float32", None),
                            (bf16, "bfloat16" if native else "float32", None),
                            (bf16, "float32", "float32"), (tiny_model, "float32", "bfloat16")):
        if env:  # $QUANTKIT_CPU_DTYPE chooses for a 16-bit model; a float32 one stays float32
            monkeypatch.setenv("QUANTKIT_CPU_DTYPE", env)
        assert ENGINES["transformers"].compute_dtype(path) == want
        engine = TransformersEngine(path, threads=1, device="cpu")
        assert engine.dtype == want
        assert {p.dtype for p in engine.model.parameters()} == {getattr(torch, want)}
        engine.close()


@pytest.mark.slow
@pytest.mark.e2e  # the demo model converted to an F16 GGUF (the GGUF recipe makes it too)
def test_llama_cpp_f16_scores_like_transformers(demo_model, monkeypatch):
    """The demo model's F16 GGUF in llama.cpp and the HF checkpoint in transformers agree, both
    computing in float32 (bf16 activations move a token's log-probability by ~2%)."""
    monkeypatch.setenv("QUANTKIT_CPU_DTYPE", "float32")
    from quantkit.engines.hf import TransformersEngine
    from quantkit.engines.llamacpp import LlamaCppEngine
    from quantkit.llamacpp_source import f16_gguf

    engines = [TransformersEngine(demo_model, threads=2),
               LlamaCppEngine(f16_gguf(demo_model)[0], threads=2)]
    scores = []
    for e in engines:
        ctx = e.encode("The capital of France is")
        scores.append([ll for ll, _ in e.loglikelihood([(ctx, e.encode(" Paris")),
                                                        (ctx, e.encode(" London"))])])
        assert "Paris" in e.generate(e.chat_prompt("What is the capital of France?"),
                                     max_tokens=16).text
    for a, b in zip(*scores):
        assert math.isclose(a, b, rel_tol=0.02, abs_tol=0.02)
    for e in engines:
        e.close()
