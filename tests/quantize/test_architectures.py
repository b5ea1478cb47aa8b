"""Every dense architecture a user brings, its structure read from the model: tiny random-weight
models built from a config with transformers' own classes, taken through quantize (GPTQ and
AWQ), reload in transformers, the KL to the original (against a damaged copy's), validate and
inspect. Mixture-of-experts models are refused, saying why, until their experts are built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _damage import scramble_scales

from quantkit.calib import load_calibration_set
from quantkit.config import QuantizeConfig
from quantkit.errors import BadInput
from quantkit.quantize import quantize
from quantkit.quantize.families import LLAMA_LIKE
from quantkit.quantize.structure import read_structure

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
            if p.ndim == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
    return out


TIED = {"gemma2", "gemma3_text"}  # Gemma ties its output head to the embeddings (vLLM requires it)


@pytest.fixture(scope="module", params=DENSE)
def arch(request, tiny_model, tmp_path_factory) -> tuple[str, Path]:
    kind = request.param
    return kind, build(kind, tiny_model, tmp_path_factory.mktemp(kind) / "model",
                       tie_word_embeddings=kind in TIED)


def _kl(path_a: Path, path_b: Path, samples: list[list[int]]) -> float:
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


def test_structure_is_read_from_the_model(arch):
    kind, path = arch
    family = read_structure(path)
    if kind == "phi3":  # the checkpoint already fuses: one linear per group
        assert family.sequential == (("self_attn.qkv_proj",), ("self_attn.o_proj",),
                                     ("mlp.gate_up_proj",), ("mlp.down_proj",))
        assert family.awq[3].prev == "mlp.gate_up_proj"  # the up half's rows take the scales
    else:
        assert family.sequential == LLAMA_LIKE.sequential
    prevs = [(m.prev, m.offset) for m in family.awq]
    if kind.startswith("gemma"):  # norms that multiply by 1 + weight; the MLP's own pre-norm
        assert prevs[0] == ("input_layernorm", 1.0)
        assert prevs[2] == ("pre_feedforward_layernorm", 1.0)
    elif kind == "olmo2":  # post-norms only: nothing before q/k/v or gate/up absorbs scales
        assert prevs[0] == (None, 0.0) and prevs[2] == (None, 0.0)
    else:
        assert prevs[0] == ("input_layernorm", 0.0)
    assert prevs[1] == (None, 0.0)  # o_proj: v's outputs are grouped-query, not o's inputs


@pytest.fixture(scope="module")
def artifacts(arch, tiny_calib, tmp_path_factory) -> dict[str, Path]:
    """The architecture's GPTQ and AWQ (W4 g32) artifacts, made once for the tests below."""
    kind, path = arch
    out = {}
    for method in ("gptq", "awq"):
        out[method] = tmp_path_factory.mktemp(f"{kind}-{method}") / "artifact"
        manifest = quantize(model=str(path), calib=tiny_calib, out=out[method],
                            cfg=QuantizeConfig(method=method, group_size=32))
        assert manifest.source.architecture and set(manifest.layer_errors) == {"0", "1"}
    return out


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantize_reload_and_kl(arch, artifacts, method, tiny_calib, tmp_path):
    kind, path = arch
    samples = load_calibration_set(tiny_calib).input_ids[:4]
    kl = _kl(path, artifacts[method], samples)
    scramble_scales(artifacts[method], tmp_path / "damaged")
    damaged = _kl(path, tmp_path / "damaged", samples)
    assert kl < 0.05, (kind, method, kl)
    assert damaged > 5 * kl, (kind, method, kl, damaged)


def test_validate_and_inspect(arch, artifacts, tiny_calib, tmp_path, cli):
    """Through the CLI on the transformers engine: the domain KL of GPTQ is small and the
    engine's log-probabilities are the model's own (Gemma's soft-capping, Granite's scaling)."""
    from transformers import AutoModelForCausalLM

    from quantkit.engines.hf import TransformersEngine

    kind, path = arch
    engine = TransformersEngine(path, threads=1, device="cpu")
    ids = load_calibration_set(tiny_calib).input_ids[0][:40]
    rows = engine.token_logprob_rows(ids)[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([engine.prefix + ids])).logits[0].log_softmax(-1)
    torch.testing.assert_close(torch.from_numpy(rows), ref[len(engine.prefix):-1],
                               rtol=1e-4, atol=1e-4)
    domain = tmp_path / "domain.jsonl"
    texts = [engine.decode(s) for s in load_calibration_set(tiny_calib).input_ids[:6]]
    domain.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    code, _, err = cli("validate", str(artifacts["gptq"]), "--baseline", str(path), "--tasks",
                       "domain", "--domain-set", str(domain), "--engine", "transformers",
                       "--out", str(tmp_path / "report"))
    assert code == 0, err[-2000:]
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["tasks"]["domain"]["kld"]["value"] < 0.15  # granite, the largest: 0.093
    code, out, err = cli("--json", "inspect", str(artifacts["gptq"]))
    assert code == 0, err[-2000:]
    shown = json.loads(out)
    assert shown["source"]["architecture"] == (
        json.loads((path / "config.json").read_text())["architectures"][0])
    assert shown["structure"] == read_structure(path).describe()


@pytest.mark.parametrize("kind", sorted(MOE))
def test_mixture_of_experts_is_refused_saying_why(kind, tiny_model, tiny_calib, tmp_path, cli):
    path = build(kind, tiny_model, tmp_path / kind, **MOE[kind])
    with pytest.raises(BadInput, match="mixture-of-experts"):
        read_structure(path)
    code, out, _ = cli("--json", "inspect", str(path))
    assert code == 0 and "mixture-of-experts" in json.loads(out)["structure"]["refused"]
    code, _, err = cli("quantize", str(path), "--method", "gptq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--out", str(tmp_path / "out" / "a"))
    assert code == 2 and "mixture-of-experts" in err and "--method gguf" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # llama.cpp's converter, an importance matrix and a Q4_K_M per model (~1 min)
@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_mixture_of_experts_quantizes_to_gguf(kind, demo_model, tmp_path, cli):
    """What the refusal's hint offers works: `--method gguf` quantizes an MoE model through
    llama.cpp's converter (the demo's tokenizer, which the converter recognises), and the
    artifact validates on llama.cpp against its F16 GGUF."""
    path = build(kind, demo_model, tmp_path / kind, **MOE[kind], vocab_size=49152)
    calib = tmp_path / "calib"
    code, _, err = cli("calibrate", str(path), "--source", "builtin:stdlib-docs", "--samples",
                       "16", "--min-tokens", "64", "--max-tokens", "128", "--out", str(calib))
    assert code == 0, err
    out = tmp_path / "gguf"
    code, _, err = cli("quantize", str(path), "--method", "gguf", "--quant-type", "Q4_K_M",
                       "--calib", str(calib), "--out", str(out))
    assert code == 0, err
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["checkpoint"] == "gguf" and manifest["imatrix"]
    domain = tmp_path / "domain.jsonl"
    domain.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n"}) + "\n"
                              for i in range(8)))
    code, _, err = cli("validate", str(out), "--baseline", str(path), "--tasks", "domain",
                       "--domain-set", str(domain), "--out", str(tmp_path / "report"))
    assert code == 0, err[-2000:]
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["engine"] == "llama.cpp" and results["tasks"]["domain"]["kld"]["value"] >= 0



def test_an_architecture_transformers_cannot_build_is_refused(tiny_model, tiny_calib, tmp_path,
                                                               cli):
    """A config whose model_type transformers does not know: exit 2 naming it, before any work,
    and `inspect` says why instead of failing."""
    import shutil

    path = tmp_path / "unknown"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "nosuch_arch"}))
    code, _, err = cli("quantize", str(path), "--method", "gptq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--out", str(tmp_path / "out" / "a"))
    assert code == 2 and "'nosuch_arch': transformers cannot build it" in err, err
    assert [ln for ln in err.splitlines() if ln.startswith("hint:")]
    assert not (tmp_path / "out").exists()
    code, out, _ = cli("--json", "inspect", str(path))
    assert code == 0 and "cannot build it" in json.loads(out)["structure"]["refused"]
