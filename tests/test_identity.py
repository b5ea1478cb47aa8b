"""A model's identity is its weights, its config and its tokenizer (issue 33): two models that
share byte-identical weights but not a config are two models, to the source check, the baseline
cache and serve; two saves of one model are one."""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import pytest

from quantkit.artifact import Manifest, identity_sha256
from quantkit.models import model_identity, model_sha256


@pytest.fixture(scope="module")
def mistral_twin(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_model's state dict and tokenizer under a Mistral config of the same shape: the
    safetensors are byte-identical, config.json is not."""
    from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM

    path = tmp_path_factory.mktemp("mistral-twin")
    for f in tiny_model.iterdir():
        if f.name not in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copy2(f, path / f.name)
    llama = AutoModelForCausalLM.from_pretrained(tiny_model)
    c = llama.config
    twin = MistralForCausalLM(MistralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings, bos_token_id=1, eos_token_id=2,
        sliding_window=64))
    twin.load_state_dict(llama.state_dict())
    twin.save_pretrained(path)
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))  # a fresh baseline cache
    return tmp_path / "home"


def _copy(model: Path, dest: Path) -> Path:
    shutil.copytree(model, dest)
    return dest


def test_same_weights_other_config_is_another_model(tiny_model, mistral_twin):
    assert filecmp.cmp(tiny_model / "model.safetensors", mistral_twin / "model.safetensors",
                       shallow=False)
    a, b = model_identity(tiny_model), model_identity(mistral_twin)
    assert a.weights == b.weights and a.tokenizer == b.tokenizer
    assert a.config != b.config and a.sha256 != b.sha256
    assert model_sha256(mistral_twin) == b.sha256 == identity_sha256(mistral_twin)


def test_rope_theta_and_chat_template_change_the_identity(tiny_model, tmp_path):
    base = model_identity(tiny_model)
    rope = _copy(tiny_model, tmp_path / "rope")
    config = json.loads((rope / "config.json").read_text())
    where = config.get("rope_parameters") or config
    where["rope_theta"] = 500000.0
    (rope / "config.json").write_text(json.dumps(config, indent=2))
    chat = _copy(tiny_model, tmp_path / "chat")
    template = chat / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>assistant", "<|im_start|>bot"))
    r, t = model_identity(rope), model_identity(chat)
    assert (r.weights, r.tokenizer) == (base.weights, base.tokenizer) and r.config != base.config
    assert (t.weights, t.config) == (base.weights, base.config) and t.tokenizer != base.tokenizer
    assert len({base.sha256, r.sha256, t.sha256}) == 3


def test_two_saves_of_one_model_are_one_model(tiny_model, tmp_path):
    """Loaded and saved again (transformers rewrites tokenizer_config.json with where it loaded
    from, and config.json with its version), and re-indented: the same identity."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    again = tmp_path / "again"
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(again)
    AutoModelForCausalLM.from_pretrained(tiny_model).save_pretrained(again)
    config = json.loads((again / "config.json").read_text())
    config.update(transformers_version="0.0.0", _name_or_path=str(tiny_model))
    (again / "config.json").write_text(json.dumps(config, indent=4, sort_keys=False))
    assert model_identity(again) == model_identity(tiny_model)


def test_manifest_records_the_identity_and_an_older_one_still_reads(tiny_artifact, tiny_model,
                                                                   mistral_twin, tmp_path):
    """A manifest before model identities (no model_sha256) reads, and its source check
    compares the weights alone, as it did."""
    source = Manifest.read(tiny_artifact).source
    ident = model_identity(tiny_model)
    assert source.model_sha256 == ident.sha256 and source.model_parts == ident.parts()
    assert source.weights_sha256 == ident.weights and source.mismatch(ident) is None
    assert "different config:" in str(source.mismatch(model_identity(mistral_twin)))
    old = tmp_path / "old"
    old.mkdir()
    data = json.loads((tiny_artifact / "quantkit.json").read_text())
    for key in ("model_sha256", "model_parts"):
        del data["source"][key]
    (old / "quantkit.json").write_text(json.dumps(data))
    older = Manifest.read(old).source
    assert older.model_sha256 is None and older.mismatch(model_identity(mistral_twin)) is None


def _validate(artifact: Path, baseline: Path, out: Path, domain: Path, *extra: str) -> list[str]:
    return ["validate", str(artifact), "--baseline", str(baseline), "--out", str(out),
            "--tasks", "domain", "--domain-set", str(domain), *extra]


@pytest.fixture(scope="module")
def domain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("domain") / "domain.jsonl"
    rows = [{"text": "def add(a, b):\n    return a + b\n"},
            {"text": "The json module parses JSON text into Python objects."}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_other_config_is_refused_as_baseline(cli, tiny_artifact, mistral_twin, domain, home,
                                             tmp_path):
    code, _, err = cli(*_validate(tiny_artifact, mistral_twin, tmp_path / "o", domain))
    assert code == 2, err
    assert "is not the source of" in err and "different config:" in err
    assert [ln.split(":")[0] for ln in err.splitlines() if ln.startswith(("error:", "hint:"))
            ] == ["error", "hint"]
    assert not (tmp_path / "o").exists()


def test_forced_baseline_does_not_reuse_the_sources_cache(cli, tiny_artifact, tiny_model,
                                                          mistral_twin, domain, home, tmp_path):
    """The bug: the twin's validation answered its baseline from the llama's cache entries."""
    code, _, err = cli(*_validate(tiny_artifact, tiny_model, tmp_path / "a", domain))
    assert code == 0, err
    cached = sorted(p.name for p in (home / "validate-cache").iterdir())
    assert len(cached) == 2  # domain and domain-kl
    code, _, err = cli(*_validate(tiny_artifact, mistral_twin, tmp_path / "b", domain, "--force"))
    assert code in (0, 1), err
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["tasks"]["domain"]["seconds"]["baseline_cached"] is False
    assert res["baseline"]["sha256"] == model_sha256(mistral_twin)
    assert res["baseline"]["source_match"] is False
    assert res["settings"]["dtype"] == "float32"  # the tiny models' own, which the CPU keeps
    assert res["artifact"]["sha256"] == model_sha256(tiny_artifact)
    now = sorted(p.name for p in (home / "validate-cache").iterdir())
    assert len(now) == 4 and set(cached) < set(now)
