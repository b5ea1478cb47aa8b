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
    assert [n.phase for n in needs] == ["quantize", "validate", "serve"]
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
    assert kv > 0 and needs[2].need_gib * GIB > art + 8192 * kv
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
    """What a 70B user meets on one GPU: the weights (131.4 GiB in bf16) do not fit one of
    validation's two vLLM engines on an 80 GiB card. The tiny model's facts, with a 70B's size."""
    import dataclasses

    info = dataclasses.replace(model_info(tiny_model), size_bytes=int(131.4 * GIB))
    r = _recipe(tmp_path, tiny_model)
    total = 80 * GIB
    needs = [n for n in recipe_needs(r, total, info, "vllm") if n.phase != "quantize"]
    with pytest.raises(BadInput, match="at its validate step") as exc:
        check_needs(needs, total)
    assert f"{VALIDATE_SHARE:.0%} of the GPU each" in str(exc.value)
    assert "validate.engine: transformers" in exc.value.hint


def test_validation_engines_share_what_two_of_them_leave_on_a_smaller_gpu(
        tiny_model: Path, tmp_path: Path) -> None:
    """vLLM starts validation's second engine only where its whole share is free, and each
    engine holds its CUDA context, graphs and buffers beyond its share (up to 5.1 GiB each,
    measured on the 8B shape). From 55 GiB up each engine takes 0.40; on a smaller GPU each takes
    what two shares and two overheads leave, and the plan checks the weights against that."""
    from quantkit.engines.vllm import ENGINE_OUTSIDE, validate_share

    assert validate_share(80 * GIB) == VALIDATE_SHARE == validate_share(141 * GIB)
    for total in (16 * GIB, 24 * GIB, 48 * GIB, 60 * GIB, 80 * GIB):
        share = validate_share(total)
        assert 0 < share <= VALIDATE_SHARE
        assert 2 * (share * total + ENGINE_OUTSIDE) <= total * (1 + 1e-9)  # the pair fits
    assert validate_share(48 * GIB) < VALIDATE_SHARE and validate_share(10 * GIB) == 0.0
    info = model_info(tiny_model)
    r = _recipe(tmp_path, tiny_model)
    small = [n for n in recipe_needs(r, 24 * GIB, info, "vllm") if n.phase == "validate"][0]
    assert small.fits and small.budget_gib == pytest.approx(validate_share(24 * GIB) * 24)
    assert f"{validate_share(24 * GIB):.0%} of the GPU each" in small.what
    # a GPU too small for two engines' overheads plans no room for either: refused, named
    with pytest.raises(BadInput, match="at its validate step"):
        check_needs(recipe_needs(r, 10 * GIB, info, "vllm")[1:2], 10 * GIB)
