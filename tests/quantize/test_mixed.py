"""Per-group sensitivity and mixed-precision artifacts (--w8-groups) on the tiny llama."""

from __future__ import annotations

import json
import os

import pytest
import torch

from quantkit.calib import load_calibration_set
from quantkit.config import QuantizeConfig, parse_candidate
from quantkit.quantize import quantize
from quantkit.quantize.families import LLAMA_LIKE
from quantkit.quantize.layers import QuantSpec, linear
from quantkit.quantize.numerics import fake_quantize
from quantkit.quantize.sensitivity import group_sensitivity, most_sensitive, token_batch


def _kl(base: torch.Tensor, logits: torch.Tensor) -> float:
    b, q = base.float().log_softmax(-1), logits.float().log_softmax(-1)
    return float((b.exp() * (b - q)).sum(-1).mean())


def test_sensitivity_is_the_kl_of_quantizing_that_group_alone(tiny_model, tiny_calib, fp_model):
    """The fast path (layers from the group's own on, fed the recorded input) gives the KL a
    whole forward of the model with only that group quantized gives."""
    ids = token_batch(load_calibration_set(tiny_calib).input_ids, 256)
    spec = QuantSpec.from_config(QuantizeConfig(method="gptq", bits=4, group_size=32, act_order=False))
    model = fp_model(tiny_model)
    sens = group_sensitivity(model, LLAMA_LIKE, ids, spec, torch.device("cpu"))
    assert list(sens) == [k for k, _, _ in LLAMA_LIKE.group_keys(2)]
    with torch.no_grad():
        base = model(ids).logits
        for key, i, step in LLAMA_LIKE.group_keys(2):
            one = fp_model(tiny_model)
            for n in step:
                mod = linear(one.model.layers[i], n)
                mod.weight.data = fake_quantize(mod.weight.data, 4, 32, True)
            assert sens[key] == pytest.approx(_kl(base, one(ids).logits), rel=1e-3, abs=1e-7)
    assert all(v > 0 for v in sens.values())
    # the model is untouched: same logits as before
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, base)


def test_mixed_artifact_keeps_the_most_sensitive_groups_at_8_bits(tiny_model, tiny_calib, tmp_path,
                                                                 cli, monkeypatch, fp_model, in_memory):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))  # the measurement is cached there
    out = tmp_path / "mixed"
    m = quantize(model=str(tiny_model), calib=tiny_calib, out=out, cfg=QuantizeConfig(
        method="gptq", group_size=32, w8_groups="3", sensitivity_tokens=256))
    sens = m.sensitivity
    assert sens is not None and len(sens["kld"]) == 8 and sens["upgrade_bits"] == 8
    assert not sens["cached"] and list((tmp_path / "home" / "sensitivity").glob("*.json"))
    assert tuple(sens["upgraded"]) == most_sensitive(sens["kld"], 3)
    assert "sensitivity" in m.timings
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert groups["group_0"]["targets"] == ["Linear"]
    assert groups["group_0"]["weights"]["num_bits"] == 4
    assert groups["group_1"]["weights"]["num_bits"] == 8
    assert len(groups["group_1"]["targets"]) == 3
    # each upgraded linear is packed at 8 bits (4 values per int32), the others at 4 (8 per word)
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in out.glob("model-layer-*.safetensors"):
        tensors.update(load_file(f))
    upgraded = set(sens["upgraded"])
    for key, i, step in LLAMA_LIKE.group_keys(2):
        for n in step:
            packed = tensors[f"model.layers.{i}.{n}.weight_packed"]
            cols = int(tensors[f"model.layers.{i}.{n}.weight_shape"][1])
            assert packed.shape[1] == cols // (4 if key in upgraded else 8), key
    # transformers (compressed-tensors) loads it with each group's own scheme: the logits are
    # those of the same engine run in memory with the same per-group schemes
    spec = QuantSpec.from_config(QuantizeConfig(method="gptq", group_size=32, act_order=True),
                                 upgrade=tuple(sens["upgraded"]))
    samples = load_calibration_set(tiny_calib).input_ids
    expected = in_memory(tiny_model, samples, spec)
    reloaded = fp_model(out)
    with torch.no_grad():
        for s in samples[:3]:
            ids = torch.tensor([s])
            torch.testing.assert_close(reloaded(ids).logits, expected(ids).logits,
                                       rtol=1e-4, atol=1e-4)
    # the 8-bit groups really are closer to the original than at 4 bits
    plain = tmp_path / "plain"
    quantize(model=str(tiny_model), calib=tiny_calib, out=plain,
             cfg=QuantizeConfig(method="gptq", group_size=32))
    ref = fp_model(tiny_model)
    ids = token_batch(samples, 256)
    with torch.no_grad():
        base = ref(ids).logits
        assert _kl(base, reloaded(ids).logits) < _kl(base, fp_model(plain)(ids).logits)
    # a second run reads the cached measurement
    again = quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "again", cfg=QuantizeConfig(
        method="gptq", group_size=32, w8_groups="3", sensitivity_tokens=256))
    assert again.sensitivity is not None and again.sensitivity["cached"]
    assert again.sensitivity["kld"] == sens["kld"]
    # inspect ranks the groups and marks the upgraded ones
    code, text, err = cli("inspect", str(out))
    assert code == 0, err
    first = max(sens["kld"], key=sens["kld"].get)
    assert "kept at 8 bits" in text and f"{first}" in text and "W8" in text
    code, stdout, _ = cli("--json", "inspect", str(out))
    ranked = json.loads(stdout)["sensitivity_ranked"]
    assert [r["group"] for r in ranked][:3] == sorted(sens["upgraded"],
                                                      key=lambda g: -sens["kld"][g])


def test_awq_mixed_artifact_reloads(tiny_model, tiny_calib, tmp_path, monkeypatch, fp_model, in_memory):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    out = tmp_path / "awq-mixed"
    m = quantize(model=str(tiny_model), calib=tiny_calib, out=out, cfg=QuantizeConfig(
        method="awq", group_size=32, w8_groups="25%", sensitivity_tokens=256))
    assert m.sensitivity is not None and len(m.sensitivity["upgraded"]) == 2  # 25% of 8
    spec = QuantSpec.from_config(QuantizeConfig(method="awq", group_size=32),
                                 upgrade=tuple(m.sensitivity["upgraded"]))
    samples = load_calibration_set(tiny_calib).input_ids
    expected = in_memory(tiny_model, samples, spec)
    with torch.no_grad():
        ids = torch.tensor([samples[0]])
        torch.testing.assert_close(fp_model(out)(ids).logits, expected(ids).logits,
                                   rtol=1e-4, atol=1e-4)


def test_candidate_names_with_upgraded_groups():
    assert parse_candidate("gptq", "W4g32+10%") == {"method": "gptq", "bits": 4,
                                                    "group_size": 32, "w8_groups": "10%"}
    assert parse_candidate("awq", "W4g64+6")["w8_groups"] == "6"
    assert parse_candidate("gptq", "W8g64")["w8_groups"] == ""
    assert QuantizeConfig(w8_groups="10%").upgrade_count(120) == 12
    assert QuantizeConfig(w8_groups="1%").upgrade_count(8) == 1
    assert QuantizeConfig(w8_groups="50").upgrade_count(8) == 8


@pytest.mark.parametrize("args,message", [
    (["--w8-groups", "lots"], "--w8-groups 'lots' is not a count or a percentage"),
    (["--w8-groups", "150%"], "is not a count or a percentage"),
    (["--w8-groups", "0"], "--w8-groups '0' is not a count or a percentage"),
    (["--w8-groups", "4", "--bits", "8"], "--w8-groups applies to GPTQ/AWQ at --bits 4"),
])
def test_bad_w8_groups_exit_2_and_nothing_written(args, message, cli, tiny_model, tiny_calib, tmp_path):
    out = tmp_path / "artifacts" / "x"
    code, _, err = cli("quantize", str(tiny_model), "--method", "gptq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--out", str(out), *args)
    assert code == 2, err
    assert err.startswith("error: ") and message in err.splitlines()[0], err
    assert not (tmp_path / "artifacts").exists()
    code, _, err = cli("auto", str(tiny_model), "--calib", str(tiny_calib), "--candidates", "W8g32+4",
                       "--out", str(out), "--thresholds", os.devnull)
    assert code == 2 and "unknown gptq candidate 'W8g32+4'" in err, err
