"""`quantkit run`'s GPU plan (quantkit.fit): each GPU step's memory need from the model's files and
the recipe, against a GPU's memory; the first step that cannot fit is one error with its hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from quantkit.config import load_recipe
from quantkit.engines.vllm import VALIDATE_SHARE
from quantkit.errors import BadInput
from quantkit.fit import GIB, check_needs, kv_bytes_per_token, quantized_bytes, recipe_needs
from quantkit.models import model_info


def _recipe(tmp_path: Path, model: Path, **serve: object) -> object:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1, "name": "fit", "model": str(model),
        "calibration": {"sources": ["builtin:stdlib-docs"], "samples": 512, "min_tokens": 512,
                        "max_tokens": 2048},
        "quantize": {"method": "gptq", "bits": 4, "group_size": 32, "device": "cuda"},
        "serve": {"engine": "vllm", "ctx_size": 8192, "gpu_memory_utilization": 0.9, **serve},
        "outputs": {"calib": "c", "artifact": "a", "report": "r"}}))
    return load_recipe(path)


def test_each_gpu_step_is_planned_and_the_first_that_cannot_fit_is_named(
        tiny_model: Path, tmp_path: Path) -> None:
    info = model_info(tiny_model)
    r = _recipe(tmp_path, tiny_model)
    needs = recipe_needs(r, 80 * GIB, info, "vllm")
    assert [n.phase for n in needs] == ["quantize", "validate", "validate (both engines)",
                                        "serve"]
    assert all(n.fits for n in needs)
    # quantization holds two float32 copies of 512 x 2048 tokens' activations
    acts = 512 * 2048 * int(info.hidden_size or 0) * 4 * 2
    assert needs[0].need_gib * GIB > acts
    # validation: the original's weights in one of two engines at 0.40 of the GPU
    assert needs[1].budget_gib == pytest.approx(VALIDATE_SHARE * 80)
    assert needs[1].need_gib * GIB > info.size_bytes
    # serving: the 4-bit artifact is smaller than the original, the KV cache of 8192 tokens
    art = quantized_bytes(info, 4, 32)
    assert 0 < art < info.size_bytes
    kv = kv_bytes_per_token(json.loads((tiny_model / "config.json").read_text()))
    assert kv > 0 and needs[3].need_gib * GIB > art + 8192 * kv
    assert check_needs(needs, 80 * GIB) == needs
    # a GPU of 1 GiB: quantization's activations (2 x 512 x 2048 x 64 x 4 bytes) do not fit
    small = recipe_needs(r, 1 * GIB, info, "vllm")
    with pytest.raises(BadInput, match="at its quantize step") as exc:
        check_needs(small, 1 * GIB)
    assert "fewer or shorter samples" in exc.value.hint
    # on transformers (no vLLM engine) only quantization is planned on the GPU
    assert [n.phase for n in recipe_needs(r, 80 * GIB, info, "transformers")] == ["quantize"]


def test_a_model_too_large_for_validation_names_the_engine_share(tiny_model: Path,
                                                                 tmp_path: Path) -> None:
    """What a 70B user meets on one GPU: the weights do not fit one of validation's two vLLM
    engines. Shown with the tiny model on a GPU a little larger than its weights."""
    info = model_info(tiny_model)
    r = _recipe(tmp_path, tiny_model)
    total = 1.5 * (info.size_bytes + 3 * GIB)  # serve fits at 0.9, validation's 0.40 does not
    needs = [n for n in recipe_needs(r, total, info, "vllm") if n.phase != "quantize"]
    with pytest.raises(BadInput, match="at its validate step") as exc:
        check_needs(needs, total)
    assert f"{VALIDATE_SHARE:.0%} of the GPU each" in str(exc.value)
    assert "validate.engine: transformers" in exc.value.hint


def test_two_engines_that_each_fit_their_share_must_also_fit_side_by_side(
        tiny_model: Path, tmp_path: Path) -> None:
    """vLLM starts validation's second engine only where its whole share is free, and each
    engine holds its CUDA context, graphs and buffers beyond its share (up to 5.1 GiB each,
    measured on the 8B shape): on a 16 GiB GPU the tiny model fits one engine's 0.40 share, but
    two shares and two overheads (12.8 + 11 GiB) do not fit; on an 80 GiB one they do (64 + 11)."""
    from quantkit.fit import ENGINE_OUTSIDE

    info = model_info(tiny_model)
    r = _recipe(tmp_path, tiny_model)
    needs = [n for n in recipe_needs(r, 16 * GIB, info, "vllm") if n.phase.startswith("validate")]
    assert needs[0].fits and not needs[1].fits
    assert needs[1].need_gib == pytest.approx(2 * (VALIDATE_SHARE * 16 + ENGINE_OUTSIDE / GIB))
    with pytest.raises(BadInput, match=r"at its validate \(both engines\) step") as exc:
        check_needs(needs, 16 * GIB)
    assert "two vLLM engines side by side" in str(exc.value)
    assert all(n.fits for n in recipe_needs(r, 80 * GIB, info, "vllm"))
