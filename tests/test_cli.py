"""The CLI contract: help without torch, bad input -> one-line error + hint, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_help_lists_commands_without_importing_torch():
    code = ("import sys; from quantkit.cli import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['--help']); print(r.output); "
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert "calibrate" in out and "inspect" in out
    assert out.strip().endswith("NOTORCH")


def test_help_shows_no_type_for_flags_and_names_every_method(cli):
    from quantkit.cli import app
    from quantkit.methods import METHODS

    code, top, _ = cli("--help")
    assert code == 0 and "--quiet" in top and "<bool>" not in top
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        code, out, _ = cli(name, "--help")
        assert code == 0 and "<bool>" not in out, name
    assert "<int>" in cli("bench", "--help")[1]  # an option that takes a value keeps its type
    code, out, _ = cli("quantize", "--help")
    summary = " ".join(out.split())
    assert all(f"{name} (" in summary for name in METHODS), summary[:400]


def _bad_inputs(tmp_path, corpus):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"text": "fine line"}\n{"text": broken\n')
    fieldless = tmp_path / "fieldless.jsonl"
    fieldless.write_text('{"text": "ok"}\n{"body": "no known field"}\n')
    prose = str(corpus["prose"])
    return {
        "missing path": (["--source", str(tmp_path / "nope.txt")], "does not exist"),
        "empty file": (["--source", str(empty)], "is empty"),
        "corrupt jsonl": (["--source", str(corrupt)], f"{corrupt}:2: corrupt JSON"),
        "no known field": (["--source", str(fieldless)], f"{fieldless}:2: record has none"),
        "unknown hf dataset": (["--source", "hf:no-such-org/no-such-set"], "could not be loaded"),
        "negative weight": (["--source", f"{prose}@-1"], "must be a positive number"),
        "weight not a number": (["--source", f"{prose}@abc"], "does not parse"),
        "min > max": (["--source", prose, "--min-tokens", "900", "--max-tokens", "100"],
                      "--min-tokens 900 is larger"),
        "zero samples": (["--source", prose, "--samples", "0"], "--samples 0 must be"),
        "missing exclude": (["--source", prose, "--exclude", str(tmp_path / "no.jsonl")],
                            "does not exist"),
        "unknown builtin": (["--source", "builtin:nope"], "unknown built-in source"),
    }


@pytest.mark.parametrize("case", [
    "missing path", "empty file", "corrupt jsonl", "no known field", "unknown hf dataset",
    "negative weight", "weight not a number", "min > max", "zero samples", "missing exclude",
    "unknown builtin"])
def test_bad_input_exit_2(case, cli, tiny_model, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if case == "unknown hf dataset":  # the libraries read the variables once, when imported
        import datasets
        import huggingface_hub

        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    args, message = _bad_inputs(tmp_path, corpus)[case]
    out = tmp_path / "calib_sets" / "x"
    code, stdout, stderr = cli("calibrate", str(tiny_model), "--out", str(out), "--min-tokens",
                               "64", "--max-tokens", "256", "--samples", "10", *args)
    assert code == 2, stderr
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 2, stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    assert lines[1].startswith("hint: ")
    assert not out.exists()


def test_existing_output_refused_unless_force(cli, tiny_model, corpus, tmp_path):
    out = tmp_path / "set"
    args = ["calibrate", str(tiny_model), "--source", str(corpus["prose"]), "--out", str(out),
            "--samples", "8", "--min-tokens", "64", "--max-tokens", "256"]
    assert cli(*args)[0] == 0
    before = (out / "samples.jsonl").read_bytes()
    code, _, stderr = cli(*args)
    assert code == 2 and "already exists" in stderr and "--force" in stderr
    assert (out / "samples.jsonl").read_bytes() == before
    code, stdout, _ = cli("--json", *args, "--force", "--seed", "3")
    assert code == 0 and json.loads(stdout)["samples"] == 8


def test_unknown_model_fails_fast(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, stderr = cli("inspect", "no-such-org/no-such-model")
    assert code == 2 and "could not be fetched" in stderr
    code, _, stderr = cli("inspect", str(tmp_path))
    assert code == 2 and "without config.json" in stderr


def test_inspect_tiny_model_and_set(cli, tiny_model, corpus, tmp_path):
    code, stdout, _ = cli("--json", "inspect", str(tiny_model))
    info = json.loads(stdout)
    assert code == 0 and info["architecture"] == "LlamaForCausalLM" and info["chat_template"]
    assert info["linear_shapes"]["model.layers.N.mlp.down_proj.weight"] == [64, 128]
    assert info["quantized"] is False
    assert info["structure"]["groups"][0] == ["self_attn.q_proj", "self_attn.k_proj",
                                              "self_attn.v_proj"]
    out = tmp_path / "s"
    cli("calibrate", str(tiny_model), "--source", str(corpus["prose"]), "--out", str(out),
        "--samples", "8", "--min-tokens", "64", "--max-tokens", "256")
    code, stdout, _ = cli("--json", "inspect", str(out))
    assert json.loads(stdout)["samples"] == 8


def test_inspect_human_output_is_a_short_summary(cli, tiny_model, corpus, tmp_path):
    """Key facts one per line, nested data summarised, not dumped as JSON."""
    code, text, err = cli("inspect", str(tiny_model))
    assert code == 0, err
    lines = text.splitlines()
    assert len(lines) <= 12 and not any(ln.lstrip().startswith(("{", "}", '"')) for ln in lines)
    assert "architecture: LlamaForCausalLM (llama), 2 layers, hidden size 64" in lines
    assert "linear input sizes: 64, 128 (group sizes that divide them all: 32, 64)" in lines
    assert "chat template: yes" in lines and "quantized: no" in lines
    assert ("gptq/awq: linear groups per layer q/k/v | o | gate/up | down; AWQ folds into "
            "input_layernorm, -, post_attention_layernorm, mlp.up_proj") in lines
    assert lines[-1] == f"every field: quantkit --json inspect {tiny_model}"
    out = tmp_path / "s"
    cli("calibrate", str(tiny_model), "--source", str(corpus["prose"]), "--out", str(out),
        "--samples", "8", "--min-tokens", "64", "--max-tokens", "256")
    code, text, err = cli("inspect", str(out))
    assert code == 0, err
    lines = text.splitlines()
    assert len(lines) <= 12 and "samples: 8, tokens: " in text
    assert f"  {corpus['prose']}: 8 samples (100% of the set)" in lines


def test_inspect_artifact_human_output_summarises_the_manifest(cli, tiny_artifact):
    code, text, err = cli("inspect", str(tiny_artifact))
    assert code == 0, err
    lines = text.splitlines()
    assert len(lines) <= 14 and not any(ln.lstrip().startswith(("{", "}", '"')) for ln in lines)
    assert lines[0] == "artifact: gptq W4A16 g32 (compressed-tensors, pack-quantized)"
    assert any(ln.startswith("layer errors: 2 layers, worst relative output error ") for ln in lines)
    assert any(ln.startswith("size: ") and " MiB -> " in ln for ln in lines)


def test_unexpected_error_is_exit_3_in_one_line(cli, tmp_path, monkeypatch):
    """Exit 1 means the gate failed; a crash is exit 3, one error line and a hint, no traceback."""
    import quantkit.calib

    def crash(**_kwargs):
        raise RuntimeError("boom\n  deep in an engine")

    monkeypatch.setattr(quantkit.calib, "calibrate", crash)
    args = ["calibrate", "smollm2-135m", "--source", "builtin:stdlib-docs", "--out",
            str(tmp_path / "o")]
    code, _, err = cli(*args)
    lines = err.strip().splitlines()
    assert code == 3, err
    assert lines[0] == "error: unexpected RuntimeError: boom deep in an engine"
    assert lines[1].startswith("hint: ") and "--debug" in lines[1] and len(lines) == 2
    with pytest.raises(RuntimeError, match="boom"):  # --debug shows the real exception
        cli("--debug", *args)


def test_stages_take_model_and_outputs_from_the_recipe(cli, tiny_model, corpus, tmp_path,
                                                        monkeypatch):
    import yaml

    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "tiny", "model": str(tiny_model),
        "calibration": {"sources": [str(corpus["prose"])], "samples": 8, "min_tokens": 64,
                        "max_tokens": 128},
        "quantize": {"method": "gptq", "group_size": 32, "device": "cpu"},
        "validate": {"tasks": ["sampling"], "samples": 2, "max_tokens": 8},
        "outputs": {"calib": str(tmp_path / "c"), "artifact": str(tmp_path / "a"),
                    "report": str(tmp_path / "r")}}))
    code, _, err = cli("calibrate", "--recipe", str(recipe))
    assert code == 0, err
    assert len((tmp_path / "c" / "samples.jsonl").read_text().splitlines()) == 8
    # a flag given overrides the recipe, the rest still comes from it
    code, _, err = cli("calibrate", "--recipe", str(recipe), "--samples", "6", "--out",
                       str(tmp_path / "c6"))
    assert code == 0, err
    assert len((tmp_path / "c6" / "samples.jsonl").read_text().splitlines()) == 6
    code, stdout, err = cli("--json", "quantize", "--recipe", str(recipe))
    assert code == 0, err
    manifest = json.loads(stdout)
    assert manifest["method"] == "gptq" and manifest["parameters"]["group_size"] == 32
    assert manifest["calibration"]["path"] == str(tmp_path / "c")
    assert json.loads((tmp_path / "a" / "quantkit.json").read_text()) == manifest
    code, stdout, err = cli("validate", "--recipe", str(recipe))
    assert code == 0, err
    assert "verdict: NOT GATED" in stdout
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert list(res["tasks"]) == ["sampling"] and res["settings"]["sampling"]["n"] == 2
    assert res["artifact"]["path"] == str(tmp_path / "a")
    assert res["baseline"]["label"] == str(tiny_model) and res["baseline"]["source_match"]


def test_third_party_bars_stay_quiet_unless_verbose(tiny_artifact, tiny_model, tmp_path):
    """Loading a compressed-tensors model: compressed-tensors draws its tqdm bars with
    disable=False (TQDM_DISABLE does not reach them) and transformers its own; none reach the
    terminal unless --verbose."""
    import os

    domain = tmp_path / "domain.jsonl"
    domain.write_text(json.dumps({"text": "def add(a, b):\n    return a + b\n"}) + "\n")
    env = {**os.environ, "QUANTKIT_HOME": str(tmp_path / "home")}
    noise = ("Applying quantization config", "Dispatching model", "Loading weights", "it/s]")

    def validate(*flags: str, out: str) -> subprocess.CompletedProcess:
        args = ["validate", str(tiny_artifact), "--baseline", str(tiny_model), "--out",
                str(tmp_path / out), "--tasks", "domain", "--domain-set", str(domain)]
        return subprocess.run([sys.executable, "-m", "quantkit", *flags, *args], env=env,
                              capture_output=True, text=True, timeout=600)

    quiet = validate(out="quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert "loading the quantized model" in quiet.stderr  # quantkit's own lines still show
    for text in noise:
        assert text not in quiet.stderr and text not in quiet.stdout, (text, quiet.stderr)
    loud = validate("--verbose", out="loud")
    assert loud.returncode == 0, loud.stderr
    assert "Applying quantization config" in loud.stderr and "Dispatching model" in loud.stderr
def test_summary_warns_when_the_report_says_poor_match():
    from pathlib import Path

    from quantkit.results import Results
    from quantkit.views import summary

    data = json.loads((Path(__file__).parent / "data" / "results-example.json").read_text())
    assert data["calibration"]["target_match"]["poor"]
    warned = [ln for ln in summary(Results.from_dict(data, "x")).splitlines()
              if "calibration set" in ln]
    assert warned == ["  warning: the calibration set matches the domain set poorly (JS divergence "
                      "0.3100 bits, above 0.2500); see the report's calibration section"]
    data["calibration"]["target_match"]["poor"] = False
    assert "calibration set" not in summary(Results.from_dict(data, "x"))


def test_auto_closing_line_names_the_artifact_and_the_next_command():
    from quantkit.contract import AutoResult
    from quantkit.views import auto_summary as typed

    def auto_summary(res: dict) -> str:
        return typed(AutoResult.from_dict(res))

    row = {"name": "W8", "verdict": "pass", "bits_per_weight": 8.5, "size_bytes": 2**20,
           "seconds": 3.0, "metrics": {}}
    res = {"candidates": [row], "skipped": [], "chosen": row, "out": "artifacts/demo",
           "report": "reports/demo"}
    assert auto_summary(res).splitlines()[-1] == "next: quantkit serve artifacts/demo"
    res["report"] = "/tmp/x y/demo"  # serve must be told where the validation is
    assert auto_summary(res).splitlines()[-1] == ("next: quantkit serve artifacts/demo "
                                                  "--reports '/tmp/x y'")
    res["report"] = None
    assert auto_summary(res).endswith("next: quantkit serve artifacts/demo --allow-unvalidated")
    res.update(chosen=None, out=None)
    assert auto_summary(res).splitlines()[-1] == "chosen: none"


def test_auto_summary_shows_each_candidates_speed_against_the_original():
    from quantkit.contract import AutoResult
    from quantkit.views import auto_summary

    fast = {"name": "FP8", "verdict": "pass", "bits_per_weight": 8.0, "size_bytes": 2**20,
            "seconds": 3.0, "metrics": {}, "speed": {"output_tok_s": 1310.0}}
    down = {**fast, "name": "W4A8g128", "speed": {"error": "vLLM exited with code 1"}}
    res = {"candidates": [down, fast], "skipped": [], "chosen": fast, "out": "artifacts/x",
           "report": None, "load": [1, 64], "prefer": "speed",
           "reference": {"output_tok_s": 1000.0}}
    text = auto_summary(AutoResult.from_dict(res))
    assert "FP8: pass, 8 bits/weight, 1.0 MiB, 3 s (); 1310 output tok/s (1.31x original)" in text
    assert "W4A8g128: pass" in text and "speed not measured: vLLM exited with code 1" in text
    assert "original: 1000 output tok/s at concurrency 1,64" in text
    assert "chosen: FP8 -> artifacts/x (--prefer speed)" in text
