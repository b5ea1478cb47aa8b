"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE as transformers 5 builds them:
fused 3-D expert parameters) through GPTQ and AWQ per expert: the structure read from the model,
the per-expert checkpoint transformers reloads, the KL to the original against a copy with two
experts swapped, the gate failing that copy, expert coverage in the manifest and `inspect`, the
all-tokens calibration of experts under the floor, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _damage import swap_experts
from _models import MOE, build, kl, quantize_both

from quantkit.calib import load_calibration_set
from quantkit.errors import BadInput
from quantkit.quantize.structure import read_structure

ROUTERS = {"mixtral": ("mlp.gate",), "qwen2_moe": ("mlp.gate", "mlp.shared_expert_gate"),
           "qwen3_moe": ("mlp.gate",), "olmoe": ("mlp.gate",)}


@pytest.fixture(scope="module", params=sorted(MOE))
def moe(request, tiny_model, tmp_path_factory) -> tuple[str, Path]:
    kind = request.param
    return kind, build(kind, tiny_model, tmp_path_factory.mktemp(kind) / "model", **MOE[kind])


@pytest.fixture(scope="module")
def moe_artifacts(moe, tiny_calib, tmp_path_factory) -> dict[str, Path]:
    """The GPTQ and AWQ (W4 g32) artifacts, made once for the tests below."""
    return quantize_both(*moe, tiny_calib, tmp_path_factory)


def _saved_keys(path: Path) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            keys |= set(st.keys())
    return keys


def test_experts_are_read_from_the_model(moe):
    """The fused experts, the routers kept in 16 bits, and per-expert names that are exactly the
    ones transformers saved the original under."""
    kind, path = moe
    family = read_structure(path)
    ex = family.experts
    assert ex is not None and ex.count == 4 and ex.top_k == 2
    assert ex.routers == ROUTERS[kind]
    assert family.sequential[:2] == (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                                     ("self_attn.o_proj",))
    saved = {k.removeprefix("model.layers.0.").removesuffix(".weight")
             for k in _saved_keys(path) if k.startswith("model.layers.0.") and ".experts." in k}
    assert saved == {m.saved.format(e=e) for m in ex.matrices for e in range(4)}
    assert [m.stop - m.start for m in ex.matrices][0] == [m.stop - m.start
                                                          for m in ex.matrices][1]  # gate, up


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantize_reload_and_kl(moe, moe_artifacts, method, tiny_calib, tmp_path):
    """transformers reloads the per-expert checkpoint into its fused experts; its KL to the
    original is small, and a copy with two experts swapped is far off."""
    kind, path = moe
    artifact = moe_artifacts[method]
    keys = _saved_keys(artifact)
    assert any(".experts.3." in k and k.endswith("weight_packed") for k in keys)
    assert not any(k.endswith(("gate.weight_packed", "shared_expert_gate.weight_packed"))
                   for k in keys)  # routers stay 16-bit
    config = json.loads((artifact / "config.json").read_text())["quantization_config"]
    assert all(any(r.split(".")[-1] in i for i in config["ignore"]) for r in ROUTERS[kind])
    samples = load_calibration_set(tiny_calib).input_ids[:4]
    clean = kl(path, artifact, samples)
    assert swap_experts(artifact, tmp_path / "swapped") > 0
    swapped = kl(path, tmp_path / "swapped", samples)
    assert clean < 0.1, (kind, method, clean)
    assert swapped > 4 * clean, (kind, method, clean, swapped)
    manifest = json.loads((artifact / "quantkit.json").read_text())
    assert manifest["experts"]["under_floor"] == 0 and manifest["experts"]["min"] > 0
    assert 4.0 < manifest["linear_bits_per_weight"] < 5.5


def test_the_gate_fails_two_swapped_experts_and_inspect_shows_coverage(moe, moe_artifacts,
                                                                       tiny_calib, tmp_path, cli):
    """Through the CLI on the transformers engine: the domain KL gate passes the artifact and
    fails (exit 1) the copy whose experts 0 and 1 are exchanged; inspect shows the experts."""
    from quantkit.engines.hf import TransformersEngine

    kind, path = moe
    engine = TransformersEngine(path, threads=1, device="cpu")
    domain = tmp_path / "domain.jsonl"
    texts = [engine.decode(s) for s in load_calibration_set(tiny_calib).input_ids[:6]]
    domain.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("domain: {kld: 0.06}\n")
    swap_experts(moe_artifacts["gptq"], tmp_path / "swapped")
    codes = {}
    for name, artifact in (("clean", moe_artifacts["gptq"]), ("swapped", tmp_path / "swapped")):
        codes[name], _, err = cli("validate", str(artifact), "--baseline", str(path), "--tasks",
                                  "domain", "--domain-set", str(domain), "--engine",
                                  "transformers", "--thresholds", str(thresholds),
                                  "--out", str(tmp_path / f"report-{name}"))
        assert codes[name] in (0, 1), err[-2000:]
    kld = {name: json.loads((tmp_path / f"report-{name}" / "results.json").read_text())[
        "tasks"]["domain"]["kld"]["value"] for name in codes}
    assert codes == {"clean": 0, "swapped": 1}, kld
    code, out, err = cli("inspect", str(moe_artifacts["gptq"]))
    assert code == 0, err
    assert "tokens per expert min" in out and "8 calibrated" in out
    code, out, _ = cli("inspect", str(path))
    assert f"experts mlp.experts: 4 per layer, top 2, routers {ROUTERS[kind][0]}" in out


def test_experts_under_the_floor_are_calibrated_on_all_tokens(tiny_model, tiny_calib, tmp_path,
                                                              cli):
    """With a floor above some experts' routed tokens, those experts are calibrated on every
    token (their weights differ from a run with a floor of 1), the manifest and the command say
    which, and the counts add up to top_k x tokens per layer."""
    path = build("qwen3_moe", tiny_model, tmp_path / "m", **MOE["qwen3_moe"])
    runs = {}
    for floor in ("1", "high"):
        if floor == "high":
            # the first layer's busiest expert count: that layer then has experts on both sides
            # of the floor whatever the tokenizer (trained on this Python's stdlib) made of the set
            counts = runs["1"]["layers"]["0"]["tokens"]
            assert min(counts) < max(counts)
            floor = str(max(counts))
        out = tmp_path / f"floor{'1' if floor == '1' else 'high'}"
        code, stdout, err = cli("quantize", str(path), "--method", "gptq", "--calib",
                                str(tiny_calib), "--group-size", "32", "--expert-floor", floor,
                                "--out", str(out))
        assert code == 0, err
        runs["1" if floor == "1" else "high"] = json.loads((out / "quantkit.json").read_text())["experts"]
    tokens = sum(map(len, load_calibration_set(tiny_calib).input_ids))
    high = runs["high"]
    under = {i: [e for e, n in enumerate(c["tokens"]) if n < int(floor)]
             for i, c in high["layers"].items()}
    assert all(sum(c["tokens"]) == 2 * tokens for c in high["layers"].values())
    assert 0 < high["under_floor"] < 8 and high["under_floor_by_layer"] == {
        i: es for i, es in under.items() if es}
    assert runs["1"]["under_floor"] == 0
    assert "calibrated on all tokens" in stdout
    from safetensors.torch import load_file

    layer, experts = "0", high["under_floor_by_layer"]["0"]  # the first: the same inputs in both
    a = load_file(tmp_path / "floor1" / f"model-layer-{int(layer):05d}.safetensors")
    b = load_file(tmp_path / "floorhigh" / f"model-layer-{int(layer):05d}.safetensors")
    name = f"model.layers.{layer}.mlp.experts.{{}}.down_proj.weight_packed"
    assert not torch.equal(a[name.format(experts[0])], b[name.format(experts[0])])
    kept = next(e for e in range(4) if e not in experts)
    assert torch.equal(a[name.format(kept)], b[name.format(kept)])


def test_what_cannot_be_calibrated_is_refused_before_any_work(tiny_model, tiny_calib, tmp_path,
                                                              cli):
    """A floor above the whole calibration set, and settings built for dense linears only:
    exit 2 naming the problem, nothing written."""
    path = build("mixtral", tiny_model, tmp_path / "m", **MOE["mixtral"])
    for extra, said in ((["--expert-floor", "100000"], "no expert can be calibrated"),
                        (["--hessians", "original"], "one per expert"),
                        (["--w8-groups", "2"], "not built for mixture-of-experts")):
        code, _, err = cli("quantize", str(path), "--method", "gptq", "--calib", str(tiny_calib),
                           "--group-size", "32", *extra, "--out", str(tmp_path / "out" / "a"))
        assert code == 2 and said in err, (extra, err)
        assert not (tmp_path / "out").exists()


def test_a_model_mixing_dense_and_moe_layers_is_refused(tiny_model, tiny_calib, tmp_path, cli):
    """The structure is read from layer 0: a Qwen2-MoE whose layer 1 is a dense MLP
    (`mlp_only_layers`) is refused naming that layer, and nothing is written."""
    path = build("qwen2_moe", tiny_model, tmp_path / "m", **MOE["qwen2_moe"], mlp_only_layers=[1])
    code, _, err = cli("quantize", str(path), "--method", "gptq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--out", str(tmp_path / "out" / "a"))
    assert code == 2 and "decoder layer 1 is built unlike layer 0" in err, err
    assert "--method gguf" in err
    assert not (tmp_path / "out").exists()


def test_experts_of_another_shape_are_refused_saying_why(tiny_model, tiny_calib, tmp_path, cli):
    """gpt-oss's experts (biases, interleaved gate/up, clamped activation) are not the
    down(act(gate) * up) this quantizes: refused with the reason and --method gguf in the hint."""
    path = build("gpt_oss", tiny_model, tmp_path / "m", num_local_experts=4,
                 num_experts_per_tok=2, intermediate_size=64, sliding_window=128)
    with pytest.raises(BadInput, match="not down"):
        read_structure(path)
    code, _, err = cli("quantize", str(path), "--method", "gptq", "--calib", str(tiny_calib),
                       "--group-size", "32", "--out", str(tmp_path / "out" / "a"))
    assert code == 2 and "--method gguf" in err, err
    assert not (tmp_path / "out").exists()


def _rtn(w: torch.Tensor, spec):
    """Round-to-nearest of one matrix, as the toy plugin's layer quantizer does it."""
    from quantkit.quantize.layers import LinearResult
    from quantkit.quantize.numerics import dequantize, quantize_rtn

    q, scale, zero = quantize_rtn(w, spec.bits, spec.group_size, spec.sym)
    deq = dequantize(q, scale, zero, spec.group_size).to(w.dtype)
    err = float((w - deq).float().pow(2).sum() / w.float().pow(2).sum())
    w.copy_(deq)
    return LinearResult(q, scale, None if spec.sym else zero, None, err, spec.bits,
                        spec.group_size)


def test_a_method_quantizes_experts_with_its_own_expert_quantizer_or_not_at_all(
        tiny_model, tiny_calib, tmp_path, cli):
    """A method that names no expert quantizer (the toy plugin's round-to-nearest) is refused on
    a mixture of experts before any work, the hint naming the methods that can; given one, its
    own is called for every expert of every layer (never GPTQ's or AWQ's)."""
    from data.toy_plugin.quantkit_toy_plugin.method import rtn_layer
    from data.toy_plugin.quantkit_toy_plugin.options import RTNOptions

    from quantkit.methods import METHODS, Method, register_method

    path = build("qwen3_moe", tiny_model, tmp_path / "m", **MOE["qwen3_moe"])
    calls: list[int] = []

    def rtn_expert(act, gate_up, down, e, x, spec):
        calls.append(e)
        return _rtn(gate_up.data[e], spec), _rtn(down.data[e], spec)

    args = ("quantize", str(path), "--method", "rtn", "--calib", str(tiny_calib), "--group-size",
            "32", "--out", str(tmp_path / "out" / "a"))
    try:
        register_method(Method("rtn", "round-to-nearest", layer=rtn_layer, options=RTNOptions))
        code, _, err = cli(*args)
        assert code == 2 and "--method rtn has no expert quantizer" in err, err
        hint = next(ln for ln in err.splitlines() if ln.startswith("hint:"))
        assert "--method gptq" in hint and "--method awq" in hint and "rtn" not in hint
        assert not (tmp_path / "out").exists()
        register_method(Method("rtn", "round-to-nearest", layer=rtn_layer, experts=rtn_expert,
                               options=RTNOptions))
        code, _, err = cli(*args)
        assert code == 0, err
    finally:
        METHODS.unregister("rtn")
    assert calls == [0, 1, 2, 3] * 2  # four experts, two layers
    manifest = json.loads((tmp_path / "out" / "a" / "quantkit.json").read_text())
    assert manifest["method"] == "rtn" and manifest["experts"]["experts"] == 8


def test_experts_stacked_in_one_tensor_are_refused_naming_the_layout(tiny_model, tiny_calib,
                                                                     tmp_path, cli):
    """GraniteMoE's checkpoint stores each layer's experts in two 3-D tensors (input_linear,
    output_linear), not one matrix per expert: refused before any work, one error naming the
    layout, one hint offering --method gguf, exit 2, nothing written."""
    path = build("granitemoe", tiny_model, tmp_path / "m", num_local_experts=4,
                 num_experts_per_tok=2)
    with pytest.raises(BadInput, match=r"stacked in one 3-D tensor \(block_sparse_moe"
                                       r"\.input_linear\.weight \[4, 256, 64\]\)"):
        read_structure(path)
    for method in ("gptq", "awq"):
        code, _, err = cli("quantize", str(path), "--method", method, "--calib", str(tiny_calib),
                           "--group-size", "32", "--out", str(tmp_path / "out" / "a"))
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        hints = [ln for ln in err.splitlines() if ln.startswith("hint:")]
        assert code == 2 and len(errors) == 1 and "input_linear" in errors[0], err
        assert len(hints) == 1 and "--method gguf" in hints[0], err
        assert not (tmp_path / "out").exists()


@pytest.mark.slow  # llama.cpp's converter, an importance matrix and a Q4_K_M per model (~1 min)
@pytest.mark.gguf
@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_mixture_of_experts_quantizes_to_gguf(kind, demo_model, tmp_path, cli):
    """What the refusal's hint offers works: `--method gguf` quantizes an MoE model through
    llama.cpp's converter (the demo's tokenizer, which the converter recognises), and the
    artifact validates on llama.cpp against its F16 GGUF."""
    path = build(kind, demo_model, tmp_path / kind, **MOE[kind], vocab_size=49152)
    calib = tmp_path / "calib"
    code, _, err = cli("calibrate", str(path), "--source", "builtin:stdlib-docs", "--samples",
                       "16", "--min-tokens", "64", "--max-tokens", "128", "--out", str(calib))
    assert code == 0, err
    out = tmp_path / "gguf"
    code, _, err = cli("quantize", str(path), "--method", "gguf", "--quant-type", "Q4_K_M",
                       "--calib", str(calib), "--out", str(out))
    assert code == 0, err
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["checkpoint"] == "gguf" and manifest["imatrix"]
    domain = tmp_path / "domain.jsonl"
    domain.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n"}) + "\n"
                              for i in range(8)))
    code, _, err = cli("validate", str(out), "--baseline", str(path), "--tasks", "domain",
                       "--domain-set", str(domain), "--out", str(tmp_path / "report"))
    assert code == 0, err[-2000:]
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["engine"] == "llama.cpp" and results["tasks"]["domain"]["kld"]["value"] >= 0



