"""Every dense architecture a user brings, its structure read from the model: tiny random-weight
models built from a config with transformers' own classes, taken through quantize (GPTQ and
AWQ), reload in transformers, the KL to the original (against a damaged copy's), validate and
inspect. Mixture-of-experts models: tests/quantize/test_experts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _damage import scramble_scales
from _models import DENSE, TIED, build, kl, quantize_both

from quantkit.calib import load_calibration_set
from quantkit.quantize.families import LLAMA_LIKE
from quantkit.quantize.structure import read_structure


@pytest.fixture(scope="module", params=DENSE)
def arch(request, tiny_model, tmp_path_factory) -> tuple[str, Path]:
    kind = request.param
    return kind, build(kind, tiny_model, tmp_path_factory.mktemp(kind) / "model",
                       tie_word_embeddings=kind in TIED)


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
    """The GPTQ and AWQ (W4 g32) artifacts, made once for the tests below."""
    return quantize_both(*arch, tiny_calib, tmp_path_factory)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantize_reload_and_kl(arch, artifacts, method, tiny_calib, tmp_path):
    kind, path = arch
    samples = load_calibration_set(tiny_calib).input_ids[:4]
    clean = kl(path, artifacts[method], samples)
    scramble_scales(artifacts[method], tmp_path / "damaged")
    damaged = kl(path, tmp_path / "damaged", samples)
    assert clean < 0.05, (kind, method, clean)
    assert damaged > 5 * clean, (kind, method, clean, damaged)


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
