"""FP8 KV cache: calibrated k/v scales in the checkpoint, validation that scores the cache vLLM
will hold, `quantkit serve` passing it on, the long-context task that can see what it loses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quantkit.config import QuantizeConfig, ServeConfig
from quantkit.fp8 import FP8, to_fp8
from quantkit.kvcache import KV_SCHEME, KVObserver, attention_modules, kv_hooked
from quantkit.quantize import quantize


@pytest.fixture(scope="module")
def kv_artifact(tiny_model: Path, tiny_calib: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Path:
    out = tmp_path_factory.mktemp("kv") / "gptq-kv"
    quantize(model=str(tiny_model), cfg=QuantizeConfig(method="gptq", group_size=32,
                                                       kv_cache="fp8"),
             calib=tiny_calib, out=out)
    return out


def _scales(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in folder.glob("*.safetensors"):
        out.update({k: v for k, v in load_file(str(f)).items() if k.endswith(("k_scale",
                                                                              "v_scale"))})
    return out


def test_scales_are_the_largest_key_and_value_over_448(kv_artifact, tiny_calib, fp_model):
    """Each layer's k_scale / v_scale is max |key after RoPE| / max |value| that the quantized
    model's attention sees on the calibration set, over 448, and config.json declares them."""
    from quantkit.calib import load_calibration_set

    qc = json.loads((kv_artifact / "config.json").read_text())["quantization_config"]
    assert {k: qc["kv_cache_scheme"][k] for k in KV_SCHEME} == KV_SCHEME
    stored = _scales(kv_artifact)
    assert sorted(stored) == [f"model.layers.{i}.self_attn.{s}" for i in (0, 1)
                              for s in ("k_scale", "v_scale")]
    model = fp_model(kv_artifact)
    observer = KVObserver()
    mods = [m for layer in model.model.layers for m in attention_modules(layer).values()]
    with kv_hooked(mods, observer), torch.no_grad():
        for ids in load_calibration_set(tiny_calib).input_ids:
            model(torch.tensor([ids]))
    for i, layer in enumerate(model.model.layers):
        want = observer.scales(layer.self_attn)
        for key in ("k_scale", "v_scale"):
            got = stored[f"model.layers.{i}.self_attn.{key}"]
            assert got.dtype == torch.float32 and got.shape == (1,)
            assert got.item() == pytest.approx(want[key].item(), rel=2e-3), (i, key)


def test_validation_scores_the_fp8_cache(kv_artifact, tmp_path):
    """The transformers engine stores keys and values as vLLM's FP8 cache would: the logits move
    from the same weights' with a 16-bit cache, and the keys its attention sees lie on the FP8
    grid times the layer's scale."""
    import shutil

    from quantkit.engines.hf import TransformersEngine

    plain = tmp_path / "plain"
    shutil.copytree(kv_artifact, plain)
    cfg = json.loads((plain / "config.json").read_text())
    del cfg["quantization_config"]["kv_cache_scheme"]
    (plain / "config.json").write_text(json.dumps(cfg))
    fp8, bf = TransformersEngine(kv_artifact), TransformersEngine(plain)
    assert (fp8.kv_cache, bf.kv_cache) == ("fp8", "auto")
    ids = torch.randint(3, 1000, (1, 40))
    seen: list[torch.Tensor] = []
    attn = fp8.model.model.layers[1].self_attn
    scale = _scales(kv_artifact)["model.layers.1.self_attn.k_scale"]
    with torch.no_grad():
        a = fp8.model(ids).logits
        b = bf.model(ids).logits
        # what the attention function receives, after the emulation
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        inner = ALL_ATTENTION_FUNCTIONS["sdpa"]
        ALL_ATTENTION_FUNCTIONS["sdpa"] = lambda m, q, k, *r, **kw: (
            seen.append(k) if m is attn else None) or inner(m, q, k, *r, **kw)
        try:
            fp8.model(ids)
        finally:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = inner
    assert 1e-4 < (a - b).abs().max() < 1.0
    k = seen[0] / scale  # on the FP8 grid up to float32's rounding of the division
    assert to_fp8(k).dtype == FP8
    assert torch.allclose(to_fp8(k).float(), k, rtol=1e-5, atol=0)
    # the keys of the 16-bit cache are not: the check can tell
    assert not torch.allclose(to_fp8(k * 1.01).float(), k * 1.01, rtol=1e-5, atol=0)


def test_serve_passes_the_cache_on(kv_artifact, tmp_path):
    from quantkit.serve.engines.vllm import vllm_command
    from quantkit.serve.target import resolve_target

    t = resolve_target(kv_artifact)
    cmd = vllm_command("vllm", t, ServeConfig(), 9000, 2048)
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"
    # asked for explicitly on an artifact without scales; and left to auto there
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    bare = resolve_target(tmp_path)
    assert "--kv-cache-dtype" not in vllm_command("vllm", bare, ServeConfig(), 9000, 2048)
    cmd = vllm_command("vllm", bare, ServeConfig(kv_cache_dtype="fp8"), 9000, 2048)
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8"


def test_bad_kv_options_exit_2(cli, tiny_model, tiny_calib, tmp_path):
    for args, words in ((["--method", "gguf", "--kv-cache", "fp8"], "a GGUF server sets its cache"),
                        (["--kv-cache", "int4"], "unknown --kv-cache 'int4'"),
                        (["--hessians", "original", "--kv-cache", "fp8"], "--hessians original")):
        out = tmp_path / "o"
        code, _, err = cli("quantize", str(tiny_model), "--calib", str(tiny_calib), "--out",
                           str(out), *args)
        assert code == 2 and words in err and "hint:" in err, (args, err)
        assert not out.exists()
    code, _, err = cli("serve", str(tiny_model), "--engine", "transformers", "--kv-cache-dtype",
                       "fp8")
    assert code == 2 and "needs an engine with an FP8 KV cache (vllm); transformers keeps" in err
    code, _, err = cli("serve", str(tiny_model), "--kv-cache-dtype", "fp16")
    assert code == 2 and "unknown --kv-cache-dtype 'fp16'" in err


@pytest.mark.parametrize(("kind", "method"), [("gemma2", "fp8"), ("qwen3", "fp8"),
                                              ("phi3", "fp8"), ("mixtral", "gptq")])
def test_other_architectures_take_fp8_and_its_kv_cache(kind, method, tiny_model, tiny_calib,
                                                       tmp_path):
    """FP8-static with an FP8 KV cache on dense architectures other than llama (Gemma's soft-
    capped attention, Qwen3's q/k norms, Phi-3's fused projections), and the KV cache with GPTQ
    on a mixture of experts: a scale pair per layer, found by validation's engine."""
    from _models import MOE, build

    from quantkit.engines.hf import TransformersEngine

    model = build(kind, tiny_model, tmp_path / "m", **MOE.get(kind, {}))
    cfg = (QuantizeConfig(method="fp8", static=True, kv_cache="fp8") if method == "fp8" else
           QuantizeConfig(method="gptq", group_size=32, kv_cache="fp8", expert_floor=16))
    quantize(model=str(model), cfg=cfg, calib=tiny_calib, out=tmp_path / "q")
    assert len(_scales(tmp_path / "q")) == 2 * 2  # k and v, two layers
    engine = TransformersEngine(tmp_path / "q")
    assert engine.kv_cache == "fp8"
    with torch.no_grad():
        assert torch.isfinite(engine.model(torch.randint(3, 1000, (1, 24))).logits).all()


def test_fp8_weights_refuse_a_mixture_of_experts(cli, tiny_model, tiny_calib, tmp_path):
    from _models import MOE, build

    model = build("qwen3_moe", tiny_model, tmp_path / "m", **MOE["qwen3_moe"])
    code, _, err = cli("quantize", str(model), "--method", "fp8", "--calib", str(tiny_calib),
                       "--out", str(tmp_path / "o"))
    assert code == 2 and "built for dense models" in err and "hint:" in err
    assert not (tmp_path / "o").exists()
