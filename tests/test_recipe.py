"""Recipes: every shipped recipe loads; unknown keys and versions are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.config import load_recipe
from quantkit.errors import BadInput

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_load(path: Path) -> None:
    r = load_recipe(path)
    assert r.version == 1 and r.name == path.stem
    assert r.quantize.method in ("gptq", "awq", "gguf")


def test_demo_recipe_is_small() -> None:
    r = load_recipe(RECIPES / "demo.yaml")
    assert r.model == "smollm2-135m" and r.auto is not None
    # the ladder climbs in size: plain W4, then more groups kept at W8, then all W8
    assert r.auto.ladder == ("W4g32", "W4g32+25%", "W4g32+50%", "W8g64")
    assert r.auto.shared_hessians
    assert 128 <= r.calibration.samples <= 512 and r.validate.limit
    assert r.validate.thresholds["domain"] == {"ppl_increase": 0.10, "qa_retention": 0.9,
                                               "kld": 0.05}


@pytest.mark.parametrize("method, last", [("gptq", "W8"), ("awq", "W8"), ("gguf", "Q8_0")])
def test_default_ladder_ends_with_a_rung_every_model_takes(method: str, last: str) -> None:
    from quantkit.config import AutoConfig, parse_candidate

    cfg = AutoConfig(method=method)
    cfg.check()
    assert cfg.ladder[-1] == last
    if method != "gguf":  # 8-bit per channel: no group size to divide the layers
        assert parse_candidate(method, last)["group_size"] == -1
        assert "W8g128" not in cfg.ladder


@pytest.mark.parametrize("text, words", [
    ("version: 2\n", "version 2 is not supported"),
    ("version: 1\nname: x\nmodel: m\ncalibration: {sources: [a]}\nquantize: {method: gptq}\n"
     "outputs: {calib: a, artifact: b, report: c}\nfoo: 1\n", "unknown key 'foo'"),
    ("version: 1\nname: x\nmodel: m\ncalibration: {sources: [a], sample: 3}\n"
     "quantize: {method: gptq}\noutputs: {calib: a, artifact: b, report: c}\n",
     "calibration: unknown key 'sample'"),
    ("version: 1\nname: x\nmodel: m\ncalibration: {sources: [a]}\nquantize: {method: gptq}\n"
     "outputs: {calib: a, artifact: b, report: c}\nvalidate: {thresholds: {mmlu: {ret: 1}}}\n",
     "unknown metric mmlu.ret"),
    ("version: 1\nname: x\nmodel: m\nquantize: {method: gptq}\n", "missing 'calibration'"),
    ("version: 1\nname: x\nmodel: m\ncalibration: {sources: [a]}\nquantize: {method: gptq}\n"
     "outputs: {calib: a, artifact: b, report: c}\nauto: {candidates: [W4g7x]}\n",
     "unknown gptq candidate 'W4g7x'"),
])
def test_bad_recipes(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(BadInput, match=words):
        load_recipe(p)


def test_run_bad_recipe_exit_2(cli, tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("version: 1\nname: x\nbogus: 1\n")
    code, _, err = cli("run", str(p))
    assert code == 2 and "unknown key 'bogus'" in err and "hint:" in err


def test_run_refuses_a_serve_context_past_the_model_before_any_work(
        cli, tmp_path: Path, tiny_model: Path) -> None:
    """serve.ctx_size over the model's trained context is refused before calibration, not by
    the server after quantization and validation."""
    p = tmp_path / "r.yaml"
    p.write_text(f"version: 1\nname: x\nmodel: {tiny_model}\n"
                 f"calibration: {{sources: [{tiny_model}/config.json]}}\n"
                 f"quantize: {{method: gptq}}\nvalidate: {{tasks: [sampling]}}\n"
                 f"serve: {{ctx_size: 4096}}\n"
                 f"outputs: {{calib: {tmp_path}/c, artifact: {tmp_path}/a, report: {tmp_path}/r}}\n")
    code, _, err = cli("run", str(p))
    assert code == 2 and "serve.ctx_size 4096 is longer than the 2048 tokens" in err, err
    assert "hint: set serve.ctx_size to 2048 or less" in err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["r.yaml"]
