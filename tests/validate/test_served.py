"""Validating a thinking model as it is served (issue 48, item 3): the trained thinking model
(tests/_thinking.py) quantized at 4 bits passes against its original with its thinking closed on
both sides; the same artifact with its `</think>` output row turned against itself stops closing
its thinking, and the gate fails on think_closed_drop with exit 1; the mode and the budget are
recorded and said; a budget or a mode the model can't take is bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _damage import silence_token
from _thinking import dialogue

from quantkit.validate.think_flags import span_loop, think_flags

BUDGET = "64"  # the model's reasoning takes about 32 tokens; its context is 256


@pytest.fixture(scope="module")
def artifacts(thinking_model: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, Path, Path]:
    """(GPTQ W4 artifact, its damaged copy, a QA domain set) of the thinking model."""
    from _thinking import corpus

    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig, QuantizeConfig
    from quantkit.quantize import quantize

    tmp = tmp_path_factory.mktemp("thinking-validate")
    source = tmp / "traces.jsonl"
    source.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q},
        {"role": "assistant", "content": a, "reasoning_content": r}]}) + "\n"
        for q, r, a in corpus(40, seed=7)))
    calibrate(model=str(thinking_model), out=tmp / "set", cfg=CalibrateConfig(
        sources=(str(source),), samples=8, min_tokens=32, max_tokens=128))
    good = tmp / "w4"
    quantize(model=str(thinking_model), cfg=QuantizeConfig(method="gptq", group_size=32),
             calib=tmp / "set", out=good)
    silence_token(good, tmp / "damaged", "</think>")
    rng = random.Random(123)
    qa = tmp / "qa.jsonl"
    qa.write_text("".join(json.dumps({"prompt": q, "answer": a, "match": "exact"}) + "\n"
                          for q, _, a in (dialogue(rng) for _ in range(8))))
    return good, tmp / "damaged", qa


def _validate(cli, artifact: Path, model: Path, qa: Path, out: Path, *extra: str
              ) -> tuple[int, str, str]:
    thresholds = out.parent / "thinking-thresholds.yaml"
    thresholds.write_text("domain: {qa_retention: 0.8, think_closed_drop: 0.05}\n"
                          "sampling: {think_closed_drop: 0.05, think_tokens_increase: 0.15}\n")
    return cli("validate", str(artifact), "--baseline", str(model), "--out", str(out),
               "--tasks", "domain,sampling", "--domain-set", str(qa), "--samples", "8",
               "--max-tokens", "24", "--thinking-budget", BUDGET, "--thresholds",
               str(thresholds), *extra)


def test_the_gate_sees_a_thinking_model_stop_closing_its_thinking(
        cli, thinking_model, artifacts, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    good, damaged, qa = artifacts
    code, out, err = _validate(cli, good, thinking_model, qa, tmp_path / "good")
    assert code == 0, out + err
    res = json.loads((tmp_path / "good" / "results.json").read_text())
    assert res["settings"]["thinking"] == {"mode": "auto", "on": True, "budget": 64,
                                           "template_kwargs": {},
                                           "markers": ["<think>", "</think>"]}
    d, s = res["tasks"]["domain"], res["tasks"]["sampling"]
    for side in ("baseline", "quantized"):
        assert d[side]["qa"]["thinking"]["closed"] == 1.0 and d[side]["qa"]["accuracy"] >= 0.75
        assert s[side]["thinking"]["closed"] == 1.0 and 20 < s[side]["thinking"]["tokens"] < 64
    assert d["think_closed_drop"]["value"] == 0.0 and abs(s["think_tokens_increase"]["value"]) < 0.15
    assert all(i["output"].startswith("<think>") for i in d["quantized"]["qa"]["items"])
    report = (tmp_path / "good" / "report.html").read_text()
    assert "thinking on (--thinking auto), budget 64 tokens" in report
    # seeds auto: a thinking model sampled at 0.9 runs each item with 3 seeds, paired over both
    assert res["settings"]["seeds"] == "auto" and s["settings"]["seeds"] == 3
    assert len(s["quantized"]["outputs"]) == 24 and s["think_closed_drop"]["n"] == 24
    assert [len(v) for v in s["seeds"]["flagged_share"].values()] == [3, 3]
    assert "per seed (3), flagged share: baseline" in report
    # the card says the mode, the budget, the seeds and the verbosity change in words
    card = tmp_path / "card.md"
    code, _, err = cli("card", str(good), "--results", str(tmp_path / "good"), "--out", str(card))
    assert code == 0, err
    text = card.read_text()
    assert "## Thinking" in text and "thinking on (`--thinking auto`)" in text
    assert "a thinking budget of 64 tokens" in text and "with 3 seeds per item" in text
    assert "- Sampling check: thinking closed within it: baseline 100%, quantized 100%" in text
    assert "the quantized model thinks" in text

    code, out, err = _validate(cli, damaged, thinking_model, qa, tmp_path / "damaged")
    assert code == 1, out + err
    res = json.loads((tmp_path / "damaged" / "results.json").read_text())
    failing = res["gate"]["failing"]
    assert "domain.think_closed_drop" in failing and "sampling.think_closed_drop" in failing
    s = res["tasks"]["sampling"]
    assert s["think_closed_drop"]["value"] >= 0.5 and s["think_closed_drop"]["lo"] > 0.05
    assert s["quantized"]["flag_counts"]["unclosed_thinking"] >= 4
    assert res["tasks"]["domain"]["qa_retention"]["value"] < 0.5  # no answer after no closing


def test_thinking_off_answers_at_once(cli, thinking_model, artifacts, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    good, _, qa = artifacts
    out = tmp_path / "off"
    code, stdout, err = cli("validate", str(good), "--baseline", str(thinking_model), "--out",
                            str(out), "--tasks", "domain", "--domain-set", str(qa),
                            "--thinking", "off")
    assert code == 0, stdout + err
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["thinking"]["template_kwargs"] == {"enable_thinking": False}
    d = res["tasks"]["domain"]
    assert "think_closed_drop" not in d and d["quantized"]["qa"]["accuracy"] >= 0.75
    assert all(i["output"].startswith("It is") for i in d["quantized"]["qa"]["items"])


@pytest.mark.parametrize("extra, words", [
    (("--thinking-budget", "0"), "--thinking-budget 0 must be 1 or more"),
    (("--thinking-budget", "257"), "above the model's context (256 tokens)"),
    (("--thinking", "maybe"), "unknown --thinking 'maybe'"),
    (("--seeds", "0"), "--seeds 0 must be auto or a count from 1 to 1000")])
def test_a_budget_it_cannot_take_is_bad_input(cli, thinking_model, artifacts, tmp_path, extra,
                                              words):
    good, _, qa = artifacts
    out = tmp_path / "out"
    code, stdout, err = cli("validate", str(good), "--baseline", str(thinking_model), "--out",
                            str(out), "--tasks", "domain", "--domain-set", str(qa), *extra)
    lines = err.strip().splitlines()
    assert code == 2 and words in lines[0] and lines[0].startswith("error:")
    assert len(lines) == 2 and lines[1].startswith("hint:")
    assert not out.exists()


def test_thinking_on_for_a_model_without_a_thinking_mode(cli, tiny_artifact, tiny_model,
                                                         tmp_path):
    out = tmp_path / "out"
    code, _, err = cli("validate", str(tiny_artifact), "--baseline", str(tiny_model), "--out",
                       str(out), "--tasks", "sampling", "--thinking", "on")
    lines = err.strip().splitlines()
    assert code == 2 and lines[0] == ("error: thinking mode 'on': this model's chat template "
                                      "has no thinking mode")
    assert lines[1] == "hint: use auto or off" and len(lines) == 2 and not out.exists()


def test_the_thinking_flags():
    ok = {"answer": "It is 4.", "think_tokens": 30, "think_closed": True}
    assert think_flags("<think>a b c</think> It is 4.", list(range(40)), ok) == []
    cycling = list(range(30)) + [1, 2, 3, 4] * 20
    assert span_loop(cycling) > 0.5 and span_loop(list(range(200))) == 0.0
    assert think_flags("x", cycling, ok) == ["loop"]
    assert think_flags("so " + "!" * 30, [5], ok) == ["char_run"]
    assert think_flags("a", [5], {**ok, "think_closed": False}) == ["unclosed_thinking"]
    assert think_flags("a", [5], {**ok, "answer": " "}) == ["empty_answer"]
