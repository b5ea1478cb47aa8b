"""Calibration with reasoning: chats whose assistant turns carry reasoning (reasoning_content,
thinking, a <think> block) are rendered with thinking on through a thinking model's own template
(Qwen3's renders reasoning_content itself; DeepSeek's strips it from the last turn, which is then
spliced after its generation prompt), and dropped for a model that does not think; a reasoning
field that is not a string is bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantkit.calib import calibrate
from quantkit.config import CalibrateConfig

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
REASONING = "first add the tens then the units so the sum is forty two"


def with_template(tiny_model: Path, out: Path, name: str) -> Path:
    """The tiny model with a real thinking template (the file wins over tokenizer_config's)."""
    shutil.copytree(tiny_model, out)
    (out / "chat_template.jinja").write_text((TEMPLATES / f"{name}.jinja").read_text())
    return out


def chats(path: Path, n: int = 24, shape: str = "reasoning_content") -> Path:
    """`n` chats, each answer carrying its reasoning in the dataset shape `shape`."""
    with path.open("w") as fh:
        for i in range(n):
            answer = f"The answer to question {i} is {i * 7 + 42}, as the working shows."
            turn: dict[str, object] = {"role": "assistant", "content": answer}
            if shape == "<think>":
                turn["content"] = f"<think>\n{REASONING} for item {i}\n</think>\n\n{answer}"
            elif shape:
                turn[shape] = f"{REASONING} for item {i}"
            fh.write(json.dumps({"messages": [
                {"role": "user", "content": f"What is item {i} of the sequence, and why?"},
                turn]}) + "\n")
    return path


def run(model: Path, source: Path, out: Path) -> dict:
    return calibrate(model=str(model), out=out, cfg=CalibrateConfig(
        sources=(str(source),), samples=4, min_tokens=64, max_tokens=256))


def texts(out: Path) -> list[str]:
    return [json.loads(line)["text"] for line in (out / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("shape", ["reasoning_content", "thinking", "<think>"])
def test_qwen3_renders_reasoning_with_thinking_on(tiny_model, tmp_path, shape):
    model = with_template(tiny_model, tmp_path / "qwen3", "qwen3")
    res = run(model, chats(tmp_path / "chats.jsonl", shape=shape), tmp_path / "set")
    assert res["reasoning"]["chats_with_reasoning"] > 0 and res["reasoning"]["reasoning_dropped"] == 0
    assert res["reasoning"]["samples_with_reasoning"] == 4
    body = "".join(texts(tmp_path / "set"))
    assert f"<|im_start|>assistant\n<think>\n{REASONING} for item" in body
    assert "</think>\n\nThe answer to question" in body
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    th = manifest["thinking"]
    assert th["with_reasoning"] == "on" and th["template_kwargs_on"] == {"enable_thinking": True}
    assert th["template"]["switch"] == "enable_thinking" and th["without_reasoning"] == "auto"
    stats = json.loads((tmp_path / "set" / "stats.json").read_text())
    per = next(iter(stats["per_source"].values()))
    assert per["rendering"] == "chat_template, thinking on"


@pytest.mark.parametrize("name, opening", [("deepseek-r1-distill", "<｜Assistant｜><think>\n"),
                                            ("deepseek-v3.1", "<｜Assistant｜><think>")])
def test_deepseek_splices_the_last_turn_after_its_generation_prompt(tiny_model, tmp_path, name,
                                                                   opening):
    model = with_template(tiny_model, tmp_path / name, name)
    run(model, chats(tmp_path / "chats.jsonl"), tmp_path / "set")
    body = "".join(texts(tmp_path / "set"))
    assert f"{opening}{REASONING} for item" in body  # the template alone would have dropped it
    assert "\n</think>\n\nThe answer to question" in body and "<｜end▁of▁sentence｜>" in body


def test_model_without_thinking_drops_reasoning(tiny_model, tmp_path, cli):
    source = chats(tmp_path / "chats.jsonl")
    plain = chats(tmp_path / "plain.jsonl", shape="")
    res = run(tiny_model, source, tmp_path / "set")
    assert res["reasoning"]["reasoning_dropped"] > 0 and res["reasoning"]["chats_with_reasoning"] == 0
    run(tiny_model, plain, tmp_path / "plain-set")
    assert texts(tmp_path / "set") == texts(tmp_path / "plain-set")  # answers only, as without it
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest["thinking"]["with_reasoning"] == "dropped (no thinking mode)"
    code, out, err = cli("calibrate", str(tiny_model), "--source", str(source), "--samples", "4",
                         "--min-tokens", "64", "--max-tokens", "256", "--out",
                         str(tmp_path / "cli-set"))
    assert code == 0 and "model has no thinking mode, so it was left out" in out
    assert "has no thinking mode" in err  # the warning, on stderr
    code, out, _ = cli("inspect", str(tmp_path / "cli-set"))
    assert code == 0 and "chats' reasoning dropped (the model has no thinking mode)" in out


def test_chats_without_reasoning_render_as_before(tiny_model, corpus, tmp_path):
    """No reasoning anywhere: the same samples, the template's default mode, nothing dropped."""
    model = with_template(tiny_model, tmp_path / "qwen3", "qwen3")
    res = run(model, chats(tmp_path / "plain.jsonl", shape=""), tmp_path / "set")
    assert res["reasoning"] == {"samples_with_reasoning": 0, "chats_with_reasoning": 0,
                                "reasoning_dropped": 0, "with_reasoning": "on"}
    per = json.loads((tmp_path / "set" / "stats.json").read_text())["per_source"]
    assert next(iter(per.values()))["rendering"] == "chat_template"
    assert not {"samples_with_reasoning", "chats_with_reasoning"} & set(next(iter(per.values())))


@pytest.mark.parametrize("value", [{"steps": 3}, 12, ["a", "b"], True])
def test_reasoning_that_is_not_a_string_is_bad_input(cli, tiny_model, tmp_path, value):
    source = tmp_path / "bad.jsonl"
    good = chats(tmp_path / "good.jsonl", n=3).read_text()
    source.write_text(good + json.dumps({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": value}]}) + "\n")
    out = tmp_path / "set"
    code, _, err = cli("calibrate", str(tiny_model), "--source", str(source), "--samples", "4",
                       "--min-tokens", "64", "--out", str(out))
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: --samples")]
    assert code == 2 and len(lines) == 2, err
    assert lines[0].startswith("error: ") and "reasoning_content is a" in lines[0]
    assert "not a string" in lines[0] and lines[1].startswith("hint: ")
    assert not out.exists() and not list(tmp_path.glob(".set*"))
