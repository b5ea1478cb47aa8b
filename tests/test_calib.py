"""calibrate() on the tiny fixture model: mixing, packing, chat rendering, dedup, exclusion, target match."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from quantkit.calib import _largest_remainder, calibrate
from quantkit.config import CalibrateConfig
from quantkit.errors import BadInput


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_weighted_mix_window_and_manifest(tiny_model, corpus, tmp_path):
    out = tmp_path / "set"
    res = calibrate(model=str(tiny_model), out=out, cfg=CalibrateConfig(
        samples=50, min_tokens=64, max_tokens=256,
        sources=(f"{corpus['prose']}@0.6", f"{corpus['code']}@0.4")))
    rows = _rows(out)
    assert len(rows) == 50 == res["samples"]
    counts = {src: sum(r["source"] == src for r in rows) for src in res["mix"]}
    assert counts == {str(corpus["prose"]): 30, str(corpus["code"]): 20}
    assert all(64 <= r["n_tokens"] <= 256 == 256 and len(r["input_ids"]) == r["n_tokens"]
               for r in rows)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"samples": 50, "tokens": sum(r["n_tokens"] for r in rows)}
    assert [s["weight"] for s in manifest["sources"]] == [0.6, 0.4]
    assert all(len(s["sha256"]) == 64 for s in manifest["sources"])
    assert manifest["tokenizer"]["chat_template"] is True
    stats = json.loads((out / "stats.json").read_text())
    assert sum(b["count"] for b in stats["token_length"]["histogram"]) == 50
    assert stats["per_source"][str(corpus["prose"])]["packed_samples"] > 0  # paragraphs are short


def test_shares_within_one_sample():
    for total, shares in [(128, [0.6, 0.4]), (129, [1 / 3] * 3), (7, [0.5, 0.3, 0.2])]:
        counts = _largest_remainder(total, shares)
        assert sum(counts) == total
        assert all(abs(c - total * s) < 1 for c, s in zip(counts, shares))


def test_chat_source_uses_chat_template(tiny_model, corpus, tmp_path):
    out = tmp_path / "chat"
    calibrate(model=str(tiny_model), out=out, cfg=CalibrateConfig(
        samples=20, min_tokens=64, max_tokens=256,
        sources=(str(corpus["chats"]), str(corpus["prose"]))))
    rows = _rows(out)
    chat = [r for r in rows if r["source"] == str(corpus["chats"])]
    plain = [r for r in rows if r["source"] == str(corpus["prose"])]
    assert chat and all(r["rendering"] == "chat_template" for r in chat)
    assert all(r["text"].startswith("<|im_start|>user\n") for r in chat)
    assert all(r["rendering"] == "plain" and "<|im_start|>" not in r["text"] for r in plain)


def test_same_inputs_same_bytes(tiny_model, corpus, tmp_path):
    cfg = CalibrateConfig(samples=30, min_tokens=64, max_tokens=256, seed=7,
                          sources=(f"{corpus['chats']}@0.5", f"{corpus['code']}@0.5"))
    calibrate(model=str(tiny_model), out=tmp_path / "a", cfg=cfg)
    calibrate(model=str(tiny_model), out=tmp_path / "b", cfg=cfg)
    for name in ("samples.jsonl", "manifest.json", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    calibrate(model=str(tiny_model), out=tmp_path / "c", cfg=dataclasses.replace(cfg, seed=8))
    assert (tmp_path / "a/samples.jsonl").read_bytes() != (tmp_path / "c/samples.jsonl").read_bytes()


def test_exclude_drops_documents_sharing_13_grams(tiny_model, tmp_path):
    paras = [f"Paragraph {i} talks about topic {i} " + " ".join(f"w{i}x{j}" for j in range(60))
             for i in range(40)]
    src = tmp_path / "src.txt"
    src.write_text("\n\n".join(paras))
    evalset = tmp_path / "eval.jsonl"
    evalset.write_text("".join(json.dumps({"text": paras[i]}) + "\n" for i in (3, 17, 29)))
    out = tmp_path / "x"
    calibrate(model=str(tiny_model), out=out, cfg=CalibrateConfig(
        samples=37, min_tokens=64, max_tokens=1024, sources=(str(src),), exclude=(str(evalset),)))
    stats = json.loads((out / "stats.json").read_text())["per_source"][str(src)]
    assert stats["dropped_excluded"] == 3
    text = "".join(r["text"] for r in _rows(out))
    assert "w3x10" not in text and "w17x10" not in text and "w29x10" not in text
    assert all(f"w{i}x10 " in text for i in range(40) if i not in (3, 17, 29))


def test_dedup_counts(tiny_model, tmp_path):
    base = " ".join(f"token{j}" for j in range(300))
    docs = [base, base, base.replace("token7 ", "tokenX ")]
    docs += [f"unique doc {i} " + " ".join(f"u{i}v{j}" for j in range(150)) for i in range(10)]
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / "dd"
    cfg = CalibrateConfig(samples=11, min_tokens=32, max_tokens=4096, sources=(str(src),))
    calibrate(model=str(tiny_model), out=out, cfg=cfg)
    st = json.loads((out / "stats.json").read_text())["per_source"][str(src)]
    dropped = st.get("dropped_exact_duplicate", 0) + st.get("dropped_near_duplicate", 0)
    assert dropped == st["documents_read"] - st["documents_used"]
    texts = [r["text"] for r in _rows(out)]
    assert sum("token100" in t for t in texts) == 1  # one of the three look-alikes survives
    assert all(sum(f"u{i}v100" in t for t in texts) == 1 for i in range(10))
    with pytest.raises(BadInput, match="can give only 11"):
        calibrate(model=str(tiny_model), out=tmp_path / "more",
                  cfg=dataclasses.replace(cfg, samples=12))
    assert not (tmp_path / "more").exists()


def test_target_match_prefers_same_domain(tiny_model, corpus, tmp_path):
    target = tmp_path / "target.jsonl"
    lines = corpus["chats"].read_text().splitlines()
    target.write_text("\n".join(lines[-40:]) + "\n")
    cfg = CalibrateConfig(samples=20, min_tokens=64, max_tokens=256, target=str(target))
    near = calibrate(model=str(tiny_model), out=tmp_path / "near", cfg=dataclasses.replace(
        cfg, sources=(str(corpus["chats"]),)))["target_match"]
    far = calibrate(model=str(tiny_model), out=tmp_path / "far", cfg=dataclasses.replace(
        cfg, sources=(str(corpus["code"]),)))["target_match"]
    assert near["js_divergence"] < far["js_divergence"]
    assert near["target_token_coverage"] > far["target_token_coverage"]
    assert far["missing_top_tokens"]
    stored = json.loads((tmp_path / "far" / "stats.json").read_text())["target_match"]
    assert stored == far
