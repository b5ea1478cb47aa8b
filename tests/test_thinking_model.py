"""The trained thinking model (tests/_thinking.py, the `thinking_model` fixture): with thinking
on it greedily opens <think>, reasons, closes </think> and answers in a few words; with thinking
off it answers at once; quantkit reads its template as Qwen3's, and calibrates with its reasoning."""

from __future__ import annotations

import json
import random

from _thinking import generate

from quantkit.thinking import model_thinking


def questions(n: int, seed: int = 99) -> list[str]:
    """Questions in the training's shapes, drawn apart from its seed."""
    rng = random.Random(seed)
    return [f"{rng.choice(['What is', 'Tell me', 'How much is'])} {rng.randrange(1, 11)} "
            f"{rng.choice(['plus', 'minus', 'times'])} {rng.randrange(1, 11)}?" for _ in range(n)]


def test_it_closes_its_thinking_and_answers_briefly(thinking_model):
    th = model_thinking(thinking_model)
    out = generate(thinking_model, questions(8))  # auto: Qwen3's default, thinking on
    for prompt, text in out:
        thought, answer, closed = th.split(text, prompt)
        assert text.startswith("<think>\n") and closed, text
        assert len(thought.split()) >= 5 and answer.startswith("It is") and len(answer.split()) <= 4
    for _, text in generate(thinking_model, questions(4), mode="off"):
        assert "<think>" not in text and text.startswith("It is"), text


def test_quantkit_reads_its_template(thinking_model, cli):
    th = model_thinking(thinking_model)
    assert (th.thinks, th.switch, th.start, th.end) == (True, "enable_thinking", "<think>", "</think>")
    assert th.default_on and not th.always and th.reasoning_field == "reasoning_content"
    code, out, _ = cli("--json", "inspect", str(thinking_model))
    assert code == 0 and json.loads(out)["thinking"]["switch"] == "enable_thinking"


def test_calibrates_with_its_reasoning(thinking_model, tmp_path):
    from _thinking import corpus
    from transformers import AutoTokenizer

    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig

    source = tmp_path / "traces.jsonl"
    source.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q},
        {"role": "assistant", "content": a, "reasoning_content": r}]}) + "\n"
        for q, r, a in corpus(60, seed=7)))
    res = calibrate(model=str(thinking_model), out=tmp_path / "set", cfg=CalibrateConfig(
        sources=(str(source),), samples=4, min_tokens=64, max_tokens=128))
    assert res["reasoning"]["samples_with_reasoning"] == 4
    tok = AutoTokenizer.from_pretrained(thinking_model)
    think, end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    rows = [json.loads(x) for x in (tmp_path / "set" / "samples.jsonl").read_text().splitlines()]
    assert all(think in r["input_ids"] and end in r["input_ids"] for r in rows)
