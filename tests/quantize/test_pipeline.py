"""quantize() end to end on tiny llama models: quality vs RTN, checkpoint reload, resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from quantkit.artifact import Manifest
from quantkit.calib import load_calibration_set
from quantkit.config import QuantizeConfig
from quantkit.quantize import quantize
from quantkit.quantize.layers import QuantSpec
from quantkit.quantize.numerics import fake_quantize


@pytest.fixture(scope="module")
def calib(tiny_calib: Path) -> Path:
    """The session's calibration set of the tiny model (tests/conftest.py)."""
    return tiny_calib


def _final_hidden(model, samples) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model.model(input_ids=torch.tensor([s])).last_hidden_state for s in samples]


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_output_error_below_round_to_nearest(method, tiny_model, calib, fp_model, in_memory):
    samples = load_calibration_set(calib).input_ids
    ref = _final_hidden(fp_model(tiny_model), samples)
    spec = QuantSpec.from_config(QuantizeConfig(method=method, group_size=32, act_order=False))
    ours = _final_hidden(in_memory(tiny_model, samples, spec), samples)
    rtn = fp_model(tiny_model)
    for mod in rtn.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.weight.data = fake_quantize(mod.weight.data, 4, 32, True)
    rtn_out = _final_hidden(rtn, samples)
    err = sum(float((a - b).pow(2).sum()) for a, b in zip(ours, ref))
    err_rtn = sum(float((a - b).pow(2).sum()) for a, b in zip(rtn_out, ref))
    assert err < 0.9 * err_rtn


@pytest.mark.parametrize("method,act_order", [("gptq", False), ("gptq", True), ("awq", False)])
def test_checkpoint_reloads_with_identical_logits(method, act_order, tiny_model, calib, tmp_path,
                                                  fp_model, in_memory):
    out = tmp_path / "artifact"
    manifest = quantize(model=str(tiny_model), calib=calib, out=out,
                        cfg=QuantizeConfig(method=method, group_size=32, act_order=act_order))
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized"
    weights = config["config_groups"]["group_0"]["weights"]
    assert weights["group_size"] == 32 and weights["num_bits"] == 4
    assert weights.get("actorder") == ("weight" if act_order else None)
    assert manifest.versions["compressed-tensors"] != "not installed"
    assert set(manifest.layer_errors) == {"0", "1"}
    assert manifest.size_bytes["after"] < manifest.size_bytes["before"]
    assert Manifest.read(out) == manifest
    phases = {"load", "hash_wait", "capture", "move", "quantize", "pack", "forward", "write_wait",
              "finish"}
    assert set(manifest.timings) == phases and all(v >= 0 for v in manifest.timings.values())
    assert sum(manifest.timings.values()) <= manifest.wall_time_s
    assert not list(tmp_path.glob(".artifact*"))  # no work folder left behind
    samples = load_calibration_set(calib).input_ids[:4]
    spec = QuantSpec.from_config(QuantizeConfig(method=method, group_size=32, act_order=act_order))
    expected = in_memory(tiny_model, load_calibration_set(calib).input_ids, spec)
    reloaded = fp_model(out)
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s])
            torch.testing.assert_close(reloaded(ids).logits, expected(ids).logits,
                                       rtol=1e-4, atol=1e-4)


def test_16_bit_source_is_stored_in_16_bits(tiny_model, calib, tmp_path, fp_model, in_memory,
                                            monkeypatch):
    """A bf16 source quantized on the CPU, where the work runs in float32 whatever forward
    passes elsewhere run in ($QUANTKIT_CPU_DTYPE): scales, norms and embeddings are written in
    bf16, the bits per weight say so, and the checkpoint decodes to exactly the weights the run
    used (scales rounded to bf16 before use)."""
    monkeypatch.setenv("QUANTKIT_CPU_DTYPE", "bfloat16")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.models import safetensors_header

    src = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(src)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(src)
    out = tmp_path / "artifact"
    manifest = quantize(model=str(src), calib=calib, out=out,
                        cfg=QuantizeConfig(method="gptq", group_size=32, act_order=False))
    floating = {t["dtype"] for f in out.glob("*.safetensors")
                for t in safetensors_header(f).values() if t["dtype"].startswith(("F", "BF"))}
    assert floating == {"BF16"}
    assert manifest.parameters["store_dtype"] == "bfloat16"
    assert manifest.parameters["compute_dtype"] == "float32"
    # 4 bits plus a 16-bit scale per 32 weights, and each linear's 2 x int64 shape record
    assert manifest.linear_bits_per_weight is not None
    assert 4.5 <= manifest.linear_bits_per_weight < 4.6
    weights = sum(t["data_offsets"][1] - t["data_offsets"][0] for f in out.glob("*.safetensors")
                  for t in safetensors_header(f).values())
    assert manifest.bits_per_weight == round(weights * 8 / manifest.source.parameters, 3)
    assert manifest.size_bytes["after"] < manifest.size_bytes["before"]
    samples = load_calibration_set(calib).input_ids
    spec = QuantSpec.from_config(QuantizeConfig(method="gptq", group_size=32, act_order=False),
                                 store_dtype="bfloat16")
    expected, reloaded = in_memory(src, samples, spec), fp_model(out)
    with torch.no_grad():
        for s in samples[:4]:
            ids = torch.tensor([s])
            torch.testing.assert_close(reloaded(ids).logits, expected(ids).logits,
                                       rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def deep_model(tiny_model, tmp_path_factory):
    """Like tiny_model, but 8 layers, so a run can be killed half way."""
    from _models import save_random
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("deep")
    cfg = LlamaConfig.from_pretrained(tiny_model)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 8, 128, 256
    save_random(cfg, path, tiny_model, seed=1)
    return path


@pytest.mark.slow  # three quantize subprocesses of an 8-layer model (~1.5 min)
def test_resume_after_kill_gives_the_same_artifact(deep_model, calib, tmp_path):
    args = [sys.executable, "-m", "quantkit", "-q", "quantize", str(deep_model), "--method",
            "gptq", "--calib", str(calib), "--group-size", "32", "--device", "cpu"]
    partial = tmp_path / ".killed.partial"
    proc = subprocess.Popen(args + ["--out", str(tmp_path / "killed")], start_new_session=True)
    done = 0
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        state = partial / "resume.json"
        done = json.loads(state.read_text())["layers_done"] if state.is_file() else 0
        if done >= 2:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert 2 <= done < 8, "the run must be killed half way for this test to mean anything"
    assert not (tmp_path / "killed").exists()
    subprocess.run(args + ["--out", str(tmp_path / "killed"), "--resume"], check=True)
    subprocess.run(args + ["--out", str(tmp_path / "whole")], check=True)
    from safetensors.torch import load_file

    for shard in sorted((tmp_path / "whole").glob("*.safetensors")):
        a, b = load_file(shard), load_file(tmp_path / "killed" / shard.name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not partial.exists()


def test_a_run_stopped_at_the_checkpoints_write_resumes_without_running_a_layer(
        tiny_model, calib, tmp_path, monkeypatch):
    """Every layer finished and the write of the rest failed (the 8B recipe: a missing module;
    here a full disk): the rerun writes the same artifact without capturing inputs or running
    a layer again (the 8B resume spent 40 s of 106 s on that)."""
    from quantkit.errors import EngineError
    from quantkit.quantize import checkpoint

    cfg = QuantizeConfig(method="gptq", group_size=32, device="cpu")
    real = checkpoint.finish

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "finish", disk_full)
    with pytest.raises(EngineError, match="failed after 2 finished layers"):
        quantize(model=str(tiny_model), cfg=cfg, calib=calib, out=tmp_path / "cut")
    monkeypatch.setattr(checkpoint, "finish", real)
    resumed = quantize(model=str(tiny_model), cfg=cfg, calib=calib, out=tmp_path / "cut",
                       resume=True)
    assert not {"capture", "forward"} & set(resumed.timings), resumed.timings
    whole = quantize(model=str(tiny_model), cfg=cfg, calib=calib, out=tmp_path / "whole")
    assert {"capture", "forward"} <= set(whole.timings)
    assert resumed.layer_errors == whole.layer_errors
    from safetensors.torch import load_file

    shards = sorted(p.name for p in (tmp_path / "whole").glob("*.safetensors"))
    assert shards == sorted(p.name for p in (tmp_path / "cut").glob("*.safetensors"))
    for name in shards:
        a, b = load_file(tmp_path / "whole" / name), load_file(tmp_path / "cut" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _bad_cases(tiny_model: Path, calib: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "manifest.json").write_text("{}")
    (corrupt / "samples.jsonl").write_text('{"input_ids": [1, 2\n')
    other = tmp_path / "other-model"
    other.mkdir()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.add_tokens(["<extra_token>"])
    tok.save_pretrained(other)
    (other / "config.json").write_text((tiny_model / "config.json").read_text())
    for f in tiny_model.glob("*.safetensors"):
        os.symlink(f, other / f.name)
    m, c = str(tiny_model), str(calib)
    return {
        "unknown method": ([m, "--method", "hqq", "--calib", c], "unknown method 'hqq'"),
        "bits": ([m, "--method", "gptq", "--bits", "3", "--calib", c], "--bits 3 is not supported"),
        "group size": ([m, "--method", "gptq", "--group-size", "48", "--calib", c],
                       "--group-size 48 does not divide the input size 128 of model.layers.N"),
        "missing calib": ([m, "--method", "gptq", "--calib", str(tmp_path / "nope")],
                          "is not a calibration set"),
        "corrupt calib": ([m, "--method", "awq", "--calib", str(corrupt)], "is corrupt"),
        "other tokenizer": ([str(other), "--method", "gptq", "--calib", c],
                            "was made with another tokenizer"),
        "act-order with awq": ([m, "--method", "awq", "--act-order", "--calib", c],
                               "--act-order applies to GPTQ only"),
    }


CASES = ["unknown method", "bits", "group size", "missing calib", "corrupt calib",
         "other tokenizer", "act-order with awq"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exit_2_and_nothing_written(case, cli, tiny_model, calib, tmp_path):
    args, message = _bad_cases(tiny_model, calib, tmp_path)[case]
    out = tmp_path / "artifacts" / "x"
    code, _, err = cli("quantize", *args, "--out", str(out), "--group-size", "32", *(
        ["--group-size", "48"] if case == "group size" else []))
    assert code == 2, err
    assert err.startswith("error: ") and message in err.splitlines()[0], err
    assert not (tmp_path / "artifacts").exists()


def test_existing_output_and_quantized_model_refused(cli, tiny_model, calib, tmp_path):
    out = tmp_path / "a"
    base = ["quantize", str(tiny_model), "--method", "gptq", "--calib", str(calib),
            "--group-size", "32"]
    assert cli(*base, "--out", str(out))[0] == 0
    code, _, err = cli(*base, "--out", str(out))
    assert code == 2 and "already exists" in err
    code, _, err = cli("quantize", str(out), "--method", "gptq", "--calib", str(calib),
                       "--group-size", "32", "--out", str(tmp_path / "b"))
    assert code == 2 and "already quantized" in err and not (tmp_path / "b").exists()
    code, stdout, _ = cli("--json", "inspect", str(out))
    info = json.loads(stdout)
    assert code == 0 and info["kind"] == "artifact" and info["method"] == "gptq"


def test_one_terminal_line_for_all_layers_each_in_the_log(cli, tiny_model, calib, tmp_path,
                                                         monkeypatch):
    """The terminal gets a summary, not a line per layer; the log file and quantkit.json keep
    every layer's numbers."""
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    code, _, err = cli("quantize", str(tiny_model), "--method", "gptq", "--calib", str(calib),
                       "--out", str(tmp_path / "a"), "--group-size", "32")
    assert code == 0, err
    assert "layer 0: worst relative output error" not in err
    summary = [ln for ln in err.splitlines() if "layers quantized" in ln]
    assert len(summary) == 1 and summary[0].startswith("gptq: 2 layers quantized, worst relative")
    log = (tmp_path / "home" / "logs" / "quantize.log").read_text()
    assert "layer 0: worst relative output error" in log and "layer 1: worst" in log
    assert set(Manifest.read(tmp_path / "a").layer_errors) == {"0", "1"}
