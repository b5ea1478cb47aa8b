"""GPTQ from one pass of the original model's Hessians (--hessians original), shared in-process."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.calib import load_calibration_set
from quantkit.config import QuantizeConfig
from quantkit.methods.gptq import gptq_layer
from quantkit.quantize import hessians, quantize
from quantkit.quantize.capture import capture_inputs, next_inputs
from quantkit.quantize.families import LLAMA_LIKE
from quantkit.quantize.gptq import accumulate_hessian
from quantkit.quantize.layers import QuantSpec, linear, run_layer
from quantkit.quantize.numerics import fake_quantize


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """Each test's Hessians cache in its own temporary $QUANTKIT_HOME."""
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))


def test_original_hessians_are_the_original_models_activations(tiny_model, tiny_calib, fp_model):
    """Each step's H is X^T X of what that linear reads in the unquantized model."""
    samples = load_calibration_set(tiny_calib).input_ids
    model = fp_model(tiny_model)
    hs = hessians.original_hessians(model, LLAMA_LIKE, samples, torch.device("cpu"), 4096,
                                    key=("test", id(model)))
    ref = fp_model(tiny_model)
    batches = capture_inputs(ref, "model.layers", samples, torch.device("cpu"), 4096)
    for i, layer in enumerate(ref.model.layers):
        seen: dict[str, dict] = {step[0]: {"H": None, "n": 0} for step in LLAMA_LIKE.sequential}
        handles = [linear(layer, n).register_forward_pre_hook(
            lambda _m, a, n=n, st=seen: st[n].update(zip(("H", "n"), accumulate_hessian(
                st[n]["H"], a[0], st[n]["n"])))) for n in seen]
        outs = run_layer(layer, batches)
        for h in handles:
            h.remove()
        for n in seen:
            torch.testing.assert_close(hs[i][n], seen[n]["H"])
        batches = next_inputs(outs, batches)


def test_shared_hessians_artifact_reloads_and_beats_round_to_nearest(tiny_model, tiny_calib,
                                                                     tmp_path, fp_model):
    cfg = QuantizeConfig(method="gptq", group_size=32, hessians="original")
    m = quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "a", cfg=cfg)
    assert m.parameters["hessians"] == "original" and "hessians" in m.timings
    assert "forward" not in m.timings and "capture" not in m.timings
    # the same engine in memory: each layer quantized from the original model's Hessians
    samples = load_calibration_set(tiny_calib).input_ids
    model = fp_model(tiny_model)
    hs = hessians.original_hessians(model, LLAMA_LIKE, samples, torch.device("cpu"), 4096,
                                    key=("ref", id(model)))
    spec = QuantSpec.from_config(QuantizeConfig(method="gptq", group_size=32, act_order=True))
    for i, layer in enumerate(model.model.layers):
        gptq_layer(layer, LLAMA_LIKE, [], spec, i, hs[i])
    reloaded = fp_model(tmp_path / "a")
    ids = torch.tensor([samples[0]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        rtn = fp_model(tiny_model)
        for mod in rtn.model.layers.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.data = fake_quantize(mod.weight.data, 4, 32, True)
        base = fp_model(tiny_model)(ids).logits.log_softmax(-1)

        def kl(logits):
            return float((base.exp() * (base - logits.log_softmax(-1))).sum(-1).mean())

        assert kl(reloaded(ids).logits) < kl(rtn(ids).logits)


def test_a_second_candidate_reuses_the_pass(tiny_model, tiny_calib, tmp_path, monkeypatch):
    """Two candidates in one process (what quantkit auto does): the second takes the Hessians
    from the first's pass; its artifact is what a fresh pass would give."""
    hessians._CACHE.clear()
    first = quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "w4", cfg=QuantizeConfig(
        method="gptq", group_size=32, hessians="original"))
    assert len(hessians._CACHE) == 1
    second = quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "w8", cfg=QuantizeConfig(
        method="gptq", bits=8, group_size=32, hessians="original"))
    assert second.timings["hessians"] < first.timings["hessians"] / 5
    hessians._CACHE.clear()
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "empty-home"))
    fresh = quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "w8-fresh",
                     cfg=QuantizeConfig(method="gptq", bits=8, group_size=32, hessians="original"))
    assert fresh.timings["hessians"] > second.timings["hessians"]
    from safetensors.torch import load_file

    for shard in sorted((tmp_path / "w8").glob("model-layer-*.safetensors")):
        a, b = load_file(shard), load_file(tmp_path / "w8-fresh" / shard.name)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "w8" / "quantkit.json").read_text())["parameters"]["bits"] == 8


def test_a_later_process_reads_the_pass_from_disk(tiny_model, tiny_calib, tmp_path):
    """Two `quantkit quantize --hessians original` processes on one model and calibration set:
    the second reads the first's Hessians from $QUANTKIT_HOME/hessians and writes the same
    artifact; a damaged cache file is recomputed, not trusted."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "QUANTKIT_HOME": str(tmp_path / "home")}

    def run(out: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "quantkit", "quantize", str(tiny_model),
                               "--method", "gptq", "--calib", str(tiny_calib), "--group-size",
                               "32", "--hessians", "original", "--out", str(tmp_path / out)],
                              env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        manifest = json.loads((tmp_path / out / "quantkit.json").read_text())
        return {**manifest, "stderr": done.stderr}

    first = run("a")
    [cached] = (tmp_path / "home" / "hessians").glob("*/hessians.safetensors")
    written = cached.stat().st_mtime_ns, cached.stat().st_ino
    second = run("b")
    assert "hessians: from the cache" not in first["stderr"]
    assert "hessians: from the cache" in second["stderr"]
    # read, not recomputed: the second process left the cached file as the first wrote it
    assert (cached.stat().st_mtime_ns, cached.stat().st_ino) == written
    from safetensors.torch import load_file

    for shard in sorted((tmp_path / "a").glob("model-layer-*.safetensors")):
        a, b = load_file(shard), load_file(tmp_path / "b" / shard.name)
        assert all(torch.equal(a[k], b[k]) for k in a)
    cached.write_bytes(cached.read_bytes()[:100])
    third = run("c")
    assert "hessians: from the cache" not in third["stderr"]
    for shard in sorted((tmp_path / "a").glob("model-layer-*.safetensors")):
        a, c = load_file(shard), load_file(tmp_path / "c" / shard.name)
        assert all(torch.equal(a[k], c[k]) for k in a)


def test_hessians_original_needs_gptq(cli, tiny_model, tiny_calib, tmp_path):
    out = tmp_path / "artifacts" / "x"
    code, _, err = cli("quantize", str(tiny_model), "--method", "awq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--hessians", "original", "--out", str(out))
    assert code == 2 and "--hessians applies to GPTQ only" in err, err
    code, _, err = cli("quantize", str(tiny_model), "--method", "gptq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--hessians", "lazy", "--out", str(out))
    assert code == 2 and "unknown --hessians 'lazy'" in err, err
    assert not (tmp_path / "artifacts").exists()


def test_awq_then_gptq(tiny_model, tiny_calib, tmp_path, cli, fp_model):
    """--awq-scales: AWQ's scales folded first (the layer computes the same), then GPTQ; the
    artifact reloads as that engine run in memory gives."""
    from quantkit.methods.awq import awq_fold

    samples = load_calibration_set(tiny_calib).input_ids
    model = fp_model(tiny_model)
    batches = capture_inputs(model, "model.layers", samples, torch.device("cpu"), 4096)
    layer = model.model.layers[0]
    before = run_layer(layer, batches)
    norm = layer.input_layernorm.weight.detach().clone()
    awq_fold(layer, LLAMA_LIKE, batches,
             QuantSpec.from_config(QuantizeConfig(method="gptq", group_size=32, act_order=False)))
    assert not torch.equal(norm, layer.input_layernorm.weight)  # scales were folded in
    for a, b in zip(before, run_layer(layer, batches)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    m = quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "ag",
                 cfg=QuantizeConfig(method="gptq", group_size=32, awq_scales=True))
    assert m.parameters["awq_scales"] is True
    spec = QuantSpec.from_config(QuantizeConfig(method="gptq", group_size=32, act_order=True,
                                                awq_scales=True))
    ref = fp_model(tiny_model)
    batches = capture_inputs(ref, "model.layers", samples, torch.device("cpu"), 4096)
    for i, layer in enumerate(ref.model.layers):
        gptq_layer(layer, LLAMA_LIKE, batches, spec, i)
        batches = [(o, kw) for o, (_, kw) in zip(run_layer(layer, batches), batches)]
    ids = torch.tensor([samples[0]])
    with torch.no_grad():
        torch.testing.assert_close(fp_model(tmp_path / "ag")(ids).logits, ref(ids).logits,
                                   rtol=1e-4, atol=1e-4)
    for args, message in ((["--method", "awq", "--awq-scales"], "--awq-scales applies to GPTQ"),
                          (["--method", "gptq", "--awq-scales", "--hessians", "original"],
                           "the original model's Hessians do not apply")):
        code, _, err = cli("quantize", str(tiny_model), "--calib", str(tiny_calib), "--group-size",
                           "32", "--out", str(tmp_path / "bad" / "x"), *args)
        assert code == 2 and message in err, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("n_in", [200, 600])
def test_running_hessian_is_the_mean_gram_matrix_and_symmetric(n_in):
    """accumulate_hessian over three batches: 2/n X^T X of all rows (in float64), symmetric,
    whether the columns fit one block of the triangular product or not."""
    torch.manual_seed(0)
    xs = [torch.randn(rows, n_in) * (1 + k) for k, rows in enumerate((300, 1, 517))]
    H, n = None, 0
    for x in xs:
        H, n = accumulate_hessian(H, x, n)
    X = torch.cat(xs).double()
    assert n == X.shape[0]
    torch.testing.assert_close(H.double(), 2 / n * X.T @ X, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(H, H.T, rtol=1e-6, atol=1e-5)


def test_the_importance_matrix_reads_the_kept_hessians(tiny_model, tiny_calib, tmp_path,
                                                        fp_model, monkeypatch):
    """After a --hessians original run, a GGUF's importance matrix needs no pass: each linear's
    sum of x^2 per input channel is diag(H) * n / 2, what the pass itself collects."""
    from quantkit.models import model_identity
    from quantkit.quantize import imatrix

    # an earlier test in this process may hold these Hessians in memory (then none is written)
    monkeypatch.setattr(hessians, "_CACHE", {})
    cset = load_calibration_set(tiny_calib)
    sha = model_identity(tiny_model).sha256
    assert imatrix.from_hessians(tiny_model, sha, cset.input_ids, cset.sha256) is None
    quantize(model=str(tiny_model), calib=tiny_calib, out=tmp_path / "a",
             cfg=QuantizeConfig(method="gptq", group_size=32, hessians="original"))
    found = imatrix.from_hessians(tiny_model, sha, cset.input_ids, cset.sha256)
    assert found is not None
    sums, tokens, _, dtype = found
    assert dtype == "float32"  # the tiny model's own: a float32 model is computed in float32
    ref, ref_tokens = imatrix.collect(fp_model(tiny_model), cset.input_ids)
    assert tokens == ref_tokens and set(sums) == set(ref) and len(ref) == 7 * 2  # 2 layers
    for name, want in ref.items():
        torch.testing.assert_close(sums[name], want, rtol=1e-4, atol=1e-6)
    other = load_calibration_set(tiny_calib).input_ids[:-1]  # another set: not these Hessians
    assert imatrix.from_hessians(tiny_model, sha, other, "0" * 64) is None


def test_hessians_original_is_refused_on_a_mixture_of_experts_so_none_is_kept(
        tiny_model, tiny_calib, tmp_path, cli, monkeypatch):
    """--hessians original on a tiny Mixtral: exit 2 before any work (an expert needs a Hessian
    of its routed tokens, one per linear has none), nothing written, so no Hessians are kept
    for the importance matrix to read either: a MoE's GGUF runs the pass."""
    from _models import MOE, build

    from quantkit.models import model_identity
    from quantkit.quantize import imatrix

    monkeypatch.setattr(hessians, "_CACHE", {})
    moe = build("mixtral", tiny_model, tmp_path / "mixtral", **MOE["mixtral"])
    out = tmp_path / "a"
    code, _, err = cli("quantize", str(moe), "--method", "gptq", "--hessians", "original",
                       "--calib", str(tiny_calib), "--out", str(out))
    assert code == 2 and "error:" in err and "one per expert" in err and "hint:" in err
    assert not out.exists()
    cset = load_calibration_set(tiny_calib)
    sha = model_identity(moe).sha256
    assert hessians.read_cached(hessians.cache_key(sha, cset.sha256, "cpu",
                                                   hessians.BATCH_TOKENS["cpu"], "float32")) is None
    assert imatrix.from_hessians(moe, sha, cset.input_ids, cset.sha256) is None
